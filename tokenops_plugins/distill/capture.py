"""``distill_capture``: keep the prompts and answers of chosen models for opted-in tenants.

Off by default: nothing is captured until ``[plugins.distill_capture]`` names both the
models and the tenants::

    [plugins.distill_capture]
    models = ["ladder-large"]      # teachers whose answers are kept
    tenants = ["acme"]             # only these tenants' traffic; never anyone else's
    retention_days = 30            # pairs older than this are pruned (distill commands, serve start)
    max_rows = 100000              # newest rows kept per tenant
    logprobs = true                # ask the backend for token logprobs (the teacher's confidence)
    min_confidence = 0.0           # don't keep answers whose mean token probability is below this

Pairs go to the store's ``distill_pairs`` table through the telemetry writer (a queue
append; the request path never waits for the disk). Finished chat answers without tool
calls, streamed or not, are captured (the hook is ``tokenops_cache_store``, offered every
finished answer). Each pair keeps the answer's ``finish_reason`` and, when the backend
returned token logprobs, their mean (``mean_logprob``): the plugin asks the backend for them
through ``tokenops_wants_logprobs`` (the client's answer carries none unless it asked), and
``tokenops distill`` filters on both (``--min-confidence``, truncated answers dropped). The
plugin also registers the ``tokenops distill`` command group.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from tokenops import hookimpl

TOKENOPS_LAYER = "model_optimization"
#: The [plugins.<section>] tables this plugin reads and their keys: serve and tune refuse any other.
TOKENOPS_SETTINGS = {
    "distill_capture": ("models", "tenants", "retention_days", "max_rows", "logprobs", "min_confidence", "enabled")
}


@dataclass(slots=True)
class CaptureConfig:
    models: list[str] = field(default_factory=list)
    tenants: list[str] = field(default_factory=list)
    retention_days: float = 30.0
    max_rows: int = 100_000
    logprobs: bool = True  # ask the backend for token logprobs (off for an upstream that rejects them)
    min_confidence: float = 0.0  # mean token probability below which an answer is not kept
    enabled: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.models, list) or not isinstance(self.tenants, list):
            raise ValueError("models and tenants must be lists of names")
        if self.retention_days <= 0 or self.max_rows <= 0:
            raise ValueError("retention_days and max_rows must be > 0")
        if not isinstance(self.logprobs, bool):
            raise ValueError("logprobs must be true or false")
        if (
            isinstance(self.min_confidence, bool)
            or not isinstance(self.min_confidence, (int, float))
            or not 0.0 <= self.min_confidence <= 1.0
        ):
            raise ValueError(f"min_confidence must be a mean token probability in [0, 1], got {self.min_confidence!r}")
        if self.min_confidence > 0 and not self.logprobs:
            raise ValueError("min_confidence needs logprobs = true (the confidence comes from the token logprobs)")

    @property
    def is_active(self) -> bool:
        return self.enabled and bool(self.models) and bool(self.tenants)


class DistillCapture:
    """One gateway's capture settings and counts (each gateway has its own instance)."""

    TOKENOPS_LAYER = TOKENOPS_LAYER
    TOKENOPS_SETTINGS = TOKENOPS_SETTINGS

    def __init__(self) -> None:
        self.config = CaptureConfig()
        self.num_captured = 0
        self.num_below_confidence = 0  # answers not kept: mean token probability under min_confidence

    @hookimpl
    def tokenops_configure(self, settings):
        self.config = parse_config(dict(settings.plugin_settings("distill_capture")))

    @hookimpl
    def tokenops_wants_logprobs(self, request, model):
        """The teacher's token logprobs for a pair that will be captured (its confidence)."""
        return self.config.logprobs and _is_candidate(self.config, request, model)

    @hookimpl
    def tokenops_cache_store(self, request, response):
        cfg = self.config
        if not should_capture(cfg, request, response):
            return
        from tokenops.plugin_manager import hook
        from tokenops.types import TelemetryEvent

        mean = mean_logprob(response.token_logprobs)
        if mean is not None and math.exp(mean) < cfg.min_confidence:
            self.num_below_confidence += 1
            return
        model = response.model if response.model in cfg.models else request.model
        row = {
            "id": request.id,
            "tenant": request.tenant,
            "model": model,
            "messages": json.dumps(request.messages),
            "answer": response.text,
            "prompt_tokens": response.prompt_tokens,
            "completion_tokens": response.completion_tokens,
            "finish_reason": response.finish_reason,
            "mean_logprob": mean,
            "num_logprobs": len(response.token_logprobs or ()) or None,
        }
        hook().tokenops_record(event=TelemetryEvent("distill_pairs", row, ts=request.arrival))
        self.num_captured += 1

    @hookimpl
    def tokenops_tenant_deleted(self, tenant, store):
        """A deleted tenant's captured pairs go with it (captured earlier, whatever the config says now)."""
        if store is None:
            return None
        from tokenops.store.distill_pairs import delete

        return {"distill_pairs": delete(store, tenant=tenant)}

    @hookimpl
    def tokenops_register_commands(self, app):
        from ._cli import register

        register(app)


def parse_config(raw: dict) -> CaptureConfig:
    from tokenops.config import ConfigError

    try:
        return CaptureConfig(**raw)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"[plugins.distill_capture]: {e}") from None


def _is_candidate(cfg: CaptureConfig, request, model: str) -> bool:
    return (
        cfg.is_active
        and request.kind == "chat"
        and request.messages is not None
        and request.tenant in cfg.tenants
        and (model in cfg.models or request.model in cfg.models)
    )


def should_capture(cfg: CaptureConfig, request, response) -> bool:
    return _is_candidate(cfg, request, response.model) and response.tool_calls is None and bool(response.text)


def mean_logprob(values: list[float] | None) -> float | None:
    """The mean token logprob of an answer (``exp`` of it: the mean token probability, geometric)."""
    finite = [v for v in values or () if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None
