"""The sampling a model's authors recommend, for the fields a request leaves unset.

A request without ``temperature`` used to sample at temperature 1 from the whole vocabulary, so
a small model's first answer was often gibberish. Now each unset field takes, in order: the
model's own recommendation (a GGUF's ``general.sampling.*`` keys, a Hugging Face folder's
``generation_config.json``, as vLLM reads it; for a few models whose files carry none, what their
model card recommends), else the truncated sampler llama.cpp and Ollama
default to (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05). Requests cannot send ``min_p``
yet (a 400 names it); the model's or llama.cpp's value always applies on the bundled engine. A value the request sends always wins, field
by field; ``temperature: 0`` is greedy as before. ``GET /v1/models/{id}`` shows the defaults and
where they came from.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

#: llama.cpp's and Ollama's defaults for the fields a model does not recommend
FALLBACK_TEMPERATURE, FALLBACK_TOP_K, FALLBACK_TOP_P, FALLBACK_MIN_P = 0.8, 40, 0.95, 0.05
FALLBACK_SOURCE = "llama.cpp's defaults"


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    """What an unset ``temperature`` / ``top_p`` / ``top_k`` / ``min_p`` becomes; ``source`` says where each came from."""

    temperature: float = FALLBACK_TEMPERATURE
    top_p: float = FALLBACK_TOP_P
    top_k: int = FALLBACK_TOP_K
    min_p: float = FALLBACK_MIN_P
    source: str = FALLBACK_SOURCE

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _number(value: Any, low: float, high: float) -> float | None:
    """``value`` when it is a finite number in ``[low, high]`` (a bool is no number), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value) if low <= value <= high else None


def _from(values: dict[str, Any], source: str) -> SamplingDefaults:
    temperature = _number(values.get("temperature"), 0.0, 100.0)
    top_p = _number(values.get("top_p"), 1e-9, 1.0)
    top_k = _number(values.get("top_k"), 0, 1 << 30)
    min_p = _number(values.get("min_p"), 0.0, 0.999)
    found = (temperature, top_p, top_k, min_p)
    if all(v is None for v in found):
        return SamplingDefaults()
    return SamplingDefaults(
        temperature=FALLBACK_TEMPERATURE if temperature is None else temperature,
        top_p=FALLBACK_TOP_P if top_p is None else top_p,
        top_k=FALLBACK_TOP_K if top_k is None else int(top_k),
        min_p=FALLBACK_MIN_P if min_p is None else min_p,
        source=source + ("" if None not in found else f" (the rest: {FALLBACK_SOURCE})"),
    )


#: What a model's authors recommend on its model card when its files carry no sampling values, by
#: GGUF ``general.basename`` (lower case): SmolLM2's card generates with temperature 0.2, top-p 0.9.
MODEL_CARD_DEFAULTS: dict[str, tuple[dict[str, float], str]] = {
    "smollm2": ({"temperature": 0.2, "top_p": 0.9}, "SmolLM2's model card"),
}


def model_sampling_defaults(model: str | Path | None) -> SamplingDefaults:
    """The defaults of the model at ``model`` (a GGUF file or a Hugging Face folder; none: the
    embedded default model); its model card's (:data:`MODEL_CARD_DEFAULTS`) when its files carry
    none; llama.cpp's when it recommends none or cannot be read."""
    if not model:  # the embedded default model (SmolLM2's GGUF, or the suite's toy folder)
        from tokenops.engine.models.default_model import default_model_dir

        try:
            model = default_model_dir()
        except Exception:  # noqa: BLE001 (not installed: the engine's load says so itself)
            return SamplingDefaults()
    path = Path(model)
    try:
        if path.is_file() and path.suffix == ".gguf":
            from tokenops.engine.gguf.gguf_reader import GGUFFile

            file = GGUFFile(path)
            if not any(file.get(f"general.sampling.{g}") is not None for g in ("temp", "top_p", "top_k", "min_p")):
                card = MODEL_CARD_DEFAULTS.get(str(file.get("general.basename", "")).lower())
                if card is not None:
                    return _from(*card)
            return _from(
                {
                    k: file.get(f"general.sampling.{g}")
                    for k, g in (("temperature", "temp"), ("top_p", "top_p"), ("top_k", "top_k"), ("min_p", "min_p"))
                },
                "the GGUF's general.sampling",
            )
        config = path / "generation_config.json"
        if config.is_file():
            values = json.loads(config.read_text())
            return _from(values if isinstance(values, dict) else {}, "generation_config.json")
    except (OSError, ValueError):
        pass  # a file the loader reads itself reports its own error; the defaults fall back
    return SamplingDefaults()
