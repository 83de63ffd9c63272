"""Backend kinds (from ``tokenops_register_backends``) and replicas built from settings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tokenops.backends.base import Replica, replica_index, replica_name  # noqa: F401  (replica_* re-exported: their old home)
from tokenops.config import ConfigError, ModelConfig, Settings

BackendFactory = Callable[[ModelConfig, Settings], Any]

DEMO_MODEL_NAME = "tokenops-demo"
RANDOM_MODEL_NAME = "tokenops-random-llama"
DEMO_MOE_NAME = "tokenops-demo-moe"
DEMO_DIFFUSION_NAME = "digits-diffusion"
# Demo prices (USD per 1M input/output tokens) of the task-trained ladder, in the ratio of
# its models' per-token compute on CPU (the large one ~6x the small one), so routing
# between them has a cost to save.
LADDER_PRICES = {"tokenops-ladder-small": (0.10, 0.40), "tokenops-ladder-large": (0.60, 2.40)}


def builtin_factories() -> dict[str, BackendFactory]:
    """The built-in backend kinds with no plugin behind them (``local`` on the engine's own
    policies, ``openai``, ``embedding``, ``diffusion``). The gateway passes the kinds the
    plugins register instead (``tokenops_register_backends``: the same kinds, built with the
    plugins' engine policies, thinking budgets and diffusion plans, plus any third-party kind)."""

    def local(model: ModelConfig, settings: Settings) -> Any:
        from tokenops.backends.local import LocalBackend

        return LocalBackend(model, settings)

    def openai(model: ModelConfig, settings: Settings) -> Any:
        from tokenops.backends.openai_http import OpenAIBackend

        return OpenAIBackend(model, settings)

    def embedding(model: ModelConfig, settings: Settings) -> Any:
        from tokenops.backends.embedding import EmbeddingBackend

        return EmbeddingBackend(model, settings)

    def diffusion(model: ModelConfig, settings: Settings) -> Any:
        from tokenops.backends.diffusion import DiffusionBackend

        return DiffusionBackend(model, settings)

    return {"local": local, "openai": openai, "diffusion": diffusion, "embedding": embedding}


DEMO_REASONING_NAME = "tokenops-reasoning-small"


def default_model_configs() -> list[ModelConfig]:
    """The models served when no ``[[models]]`` are configured: the embedded default
    model (SmolLM2-135M-Instruct from its GGUF; the toy ``tokenops-demo`` when
    ``TOKENOPS_DEFAULT_MODEL`` says so), when their weights are bundled the demo MoE and the task-trained ladder
    (``tokenops-ladder-small``/``-large``), with the ``semantic`` extra the
    MiniLM embedding model (``all-minilm-l6-v2``), and with the ``diffusion`` extra the
    demo image model (``digits-diffusion``, for ``/v1/images/generations``)."""
    from pathlib import Path

    try:
        from tokenops.engine.models.default_model import default_model_name

        name = default_model_name()
    except ImportError:  # engine extras missing: the name is still the demo's
        name = DEMO_MODEL_NAME
    models = [ModelConfig(name=name, backend="local", path=None)]
    moe_dir = Path(__file__).resolve().parent.parent / "demo_models" / "moe"
    if (moe_dir / "config.json").is_file():
        models.append(ModelConfig(name=DEMO_MOE_NAME, backend="local", path=str(moe_dir)))
    for name, (cost_in, cost_out) in LADDER_PRICES.items():  # the task-trained ladder (docs/demo-models.md)
        ladder_dir = moe_dir.parent / name.removeprefix("tokenops-")
        if (ladder_dir / "config.json").is_file():
            models.append(
                ModelConfig(
                    name=name,
                    backend="local",
                    path=str(ladder_dir),
                    cost_input_per_1m=cost_in,
                    cost_output_per_1m=cost_out,
                )
            )
    reasoning_dir = moe_dir.parent / "reasoning-small"  # the ladder's reasoning member (docs/reasoning.md)
    if (reasoning_dir / "config.json").is_file():
        models.append(
            ModelConfig(name=DEMO_REASONING_NAME, backend="local", path=str(reasoning_dir), reasoning_parser="think")
        )
    from tokenops.backends.embedding import DEFAULT_EMBEDDING_MODEL, is_default_available

    if is_default_available():  # the semantic extra's MiniLM, for /v1/embeddings; loads on first use
        models.append(
            ModelConfig(name=DEFAULT_EMBEDDING_MODEL, backend="embedding", path=None, engine={"load": "lazy"})
        )
    digits_dir = Path(__file__).resolve().parent.parent / "demo_models" / DEMO_DIFFUSION_NAME
    if (digits_dir / "model_index.json").is_file() and _has_module("diffusers"):  # the diffusion extra
        models.append(  # loads on its first image request: diffusers alone takes ~2 s to import
            ModelConfig(name=DEMO_DIFFUSION_NAME, backend="diffusion", path=str(digits_dir), engine={"load": "lazy"})
        )
    return models


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def model_configs(settings: Settings) -> list[ModelConfig]:
    return list(settings.models) or default_model_configs()


def replica_urls(model: ModelConfig) -> list[str | None]:
    """One entry per replica: the URL for remote kinds, None for in-process ones."""
    if model.urls:
        return list(model.urls)
    if model.url:
        return [model.url] * model.replicas
    return [None] * model.replicas


def build_replicas(settings: Settings, factories: dict[str, BackendFactory] | None = None) -> dict[str, list[Replica]]:
    """Model name -> its replicas, each with a backend built by its kind's factory: ``factories``
    (the gateway passes the plugins' kinds, ``gateway.hooks.get_backend_factories``), else
    :func:`builtin_factories`."""
    factories = factories if factories is not None else builtin_factories()
    out: dict[str, list[Replica]] = {}
    for model in model_configs(settings):
        factory = factories.get(model.backend)
        if factory is None:
            raise ConfigError(
                f"model {model.name!r}: unknown backend kind {model.backend!r}; known: {', '.join(sorted(factories)) or 'none'}"
            )
        replicas = []
        for i, url in enumerate(replica_urls(model)):
            one = _replica_config(model, url, i)
            backend = factory(one, settings)
            replicas.append(Replica(name=backend.name, model=model.name, backend=backend, index=i))
        out[model.name] = replicas
    from tokenops.backends.lora import add_lora_replicas

    for model in model_configs(settings):
        if model.lora:
            add_lora_replicas(out, model.name, model.lora, model.max_loras)
    return out


def _replica_config(model: ModelConfig, url: str | None, index: int) -> ModelConfig:
    """A copy of ``model`` describing replica ``index`` (its own URL)."""
    import dataclasses

    return dataclasses.replace(model, url=url, urls=[], replicas=1, tags=[*model.tags, f"replica:{index}"])
