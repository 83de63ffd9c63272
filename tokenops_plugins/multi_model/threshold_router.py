"""Cost–quality threshold router (after RouteLLM): predict the probability that the
strong model is needed, route to it above a threshold.

```toml
[plugins.router]
use = "threshold"
[plugins.router.threshold]
strong = "big"
weak = "small"
predictor = "profiles/routers/win_predictor.json"   # `tokenops route train`
threshold = 0.5                                     # or set by `tokenops route calibrate`
```

The threshold written by ``tokenops route calibrate --strong-share 0.3`` (to
``profiles/routers/threshold.toml``, read when the plugin is configured) wins over the configured
one. Every decision records
its predicted probability as the route score, which is what calibration reads back.
"""

from __future__ import annotations

import tomllib
from functools import lru_cache
from pathlib import Path

from tokenops import hookimpl, may_block
from tokenops.tunables import Tunable
from tokenops.types import RouteDecision

from . import _router_config as rc
from ._text_model import Logistic

TOKENOPS_LAYER = "multi_model"
#: The [plugins.<section>] tables this plugin reads and their keys: serve and tune refuse any other.
TOKENOPS_SETTINGS = {"router": ("use", "alias", "default", "threshold")}
CALIBRATION_FILE = Path("profiles/routers/threshold.toml")

_live: dict[str, float] = {}
#: The threshold of CALIBRATION_FILE, read once when the plugin is configured (None: no file).
_calibrated: float | None = None


@lru_cache(maxsize=4)
def load_predictor(path: str) -> Logistic:
    if not Path(path).is_file():
        raise FileNotFoundError(f"win predictor {path} not found; train it with `tokenops route train`")
    return Logistic.load(path)


def current_threshold() -> float:
    if "router.threshold" in _live:
        return _live["router.threshold"]
    if _calibrated is not None:
        return _calibrated
    return float(rc.section("threshold").get("threshold", 0.5))


def decide(p_strong: float, threshold: float, strong: str, weak: str) -> RouteDecision:
    model = strong if p_strong >= threshold else weak
    side = ">=" if model == strong else "<"
    return RouteDecision(
        model, f"threshold: p(strong needed)={p_strong:.2f} {side} {threshold:.2f}", router="threshold", score=p_strong
    )


@hookimpl
def tokenops_register_tunables(register):
    register(
        Tunable(
            "router.threshold",
            "float",
            0.5,
            "Threshold router: route to the strong model when p >= this.",
            live=True,
            minimum=0.0,
            maximum=1.0,
            relevant=rc.router_in_use("threshold"),
            needs='the threshold router ([plugins.router] use = "threshold")',
        )
    )


@hookimpl
def tokenops_apply_tunables(values):
    if "router.threshold" in values:
        _live["router.threshold"] = float(values["router.threshold"])


def read_calibration(path: Path = CALIBRATION_FILE) -> float | None:
    """The threshold ``tokenops route calibrate`` wrote to ``path``, or None without the file."""
    if not path.is_file():
        return None
    try:
        return float(tomllib.loads(path.read_text())["threshold"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(
            f"threshold router calibration {path}: {e}; write it again with `tokenops route calibrate`"
        ) from None


@hookimpl
def tokenops_configure(settings):
    global _calibrated
    rc.configure(settings)
    # once, when this router is the one in use: a new calibration applies at the next start
    _calibrated = read_calibration() if rc.section().get("use") == "threshold" else None


def _is_active(request) -> bool:
    return rc.is_active("threshold", request)


@hookimpl
@may_block(when=_is_active)  # scores the prompt with the win predictor: routed in a worker thread
def tokenops_route(request, candidates, profiles):
    if not _is_active(request):
        return None
    conf = rc.section("threshold")
    strong, weak = conf.get("strong"), conf.get("weak")
    if strong not in candidates or weak not in candidates:
        raise ValueError(f"[plugins.router.threshold] strong/weak must be configured models, got {strong!r}/{weak!r}")
    assert isinstance(strong, str) and isinstance(weak, str)  # candidates are model names
    predictor = load_predictor(conf.get("predictor", "profiles/routers/win_predictor.json"))
    return decide(predictor.predict(request.prompt_text()), current_threshold(), strong, weak)


def calibrate(scores: list[float], strong_share: float) -> float:
    """The threshold that sends ``strong_share`` of the given traffic to the strong model."""
    if not scores:
        raise ValueError("no recorded threshold-router scores to calibrate on; route some traffic through it first")
    if not 0 < strong_share < 1:
        raise ValueError("--strong-share must be between 0 and 1")
    ordered = sorted(scores)
    k = min(len(ordered) - 1, max(0, int(round((1 - strong_share) * len(ordered)))))
    return ordered[k]
