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

from ._router_config import RouterConfig, router_in_use
from ._text_model import Logistic

TOKENOPS_LAYER = "multi_model"
#: The [plugins.<section>] tables this plugin reads and their keys: serve and tune refuse any other.
TOKENOPS_SETTINGS = {"router": ("use", "alias", "default", "threshold")}
CALIBRATION_FILE = Path("profiles/routers/threshold.toml")


@lru_cache(maxsize=4)
def load_predictor(path: str) -> Logistic:
    if not Path(path).is_file():
        raise FileNotFoundError(f"win predictor {path} not found; train it with `tokenops route train`")
    return Logistic.load(path)


def decide(p_strong: float, threshold: float, strong: str, weak: str) -> RouteDecision:
    model = strong if p_strong >= threshold else weak
    side = ">=" if model == strong else "<"
    return RouteDecision(
        model, f"threshold: p(strong needed)={p_strong:.2f} {side} {threshold:.2f}", router="threshold", score=p_strong
    )


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


class ThresholdRouter:
    """The threshold router of one gateway: its ``[plugins.router]``, calibrated and live threshold."""

    TOKENOPS_LAYER = TOKENOPS_LAYER
    TOKENOPS_SETTINGS = TOKENOPS_SETTINGS

    def __init__(self) -> None:
        self.rc = RouterConfig()
        #: ``router.threshold`` as last patched live (None: not patched)
        self.live_threshold: float | None = None
        #: The threshold of CALIBRATION_FILE, read once when the plugin is configured (None: no file).
        self.calibrated: float | None = None

    def current_threshold(self) -> float:
        if self.live_threshold is not None:
            return self.live_threshold
        if self.calibrated is not None:
            return self.calibrated
        return float(self.rc.section("threshold").get("threshold", 0.5))

    @hookimpl
    def tokenops_register_tunables(self, register):
        register(
            Tunable(
                "router.threshold",
                "float",
                0.5,
                "Threshold router: route to the strong model when p >= this.",
                live=True,
                minimum=0.0,
                maximum=1.0,
                relevant=router_in_use("threshold"),
                needs='the threshold router ([plugins.router] use = "threshold")',
            )
        )

    @hookimpl
    def tokenops_apply_tunables(self, values):
        if "router.threshold" in values:
            self.live_threshold = float(values["router.threshold"])

    @hookimpl
    def tokenops_configure(self, settings):
        self.rc.configure(settings)
        # once, when this router is the one in use: a new calibration applies at the next start
        self.calibrated = read_calibration() if self.rc.section().get("use") == "threshold" else None

    def is_active(self, request) -> bool:
        return self.rc.is_active("threshold", request)

    @hookimpl
    @may_block(when=lambda self, request: self.is_active(request))  # scores the prompt: routed in a worker thread
    def tokenops_route(self, request, candidates, profiles):
        if not self.is_active(request):
            return None
        conf = self.rc.section("threshold")
        strong, weak = conf.get("strong"), conf.get("weak")
        if strong not in candidates or weak not in candidates:
            raise ValueError(
                f"[plugins.router.threshold] strong/weak must be configured models, got {strong!r}/{weak!r}"
            )
        assert isinstance(strong, str) and isinstance(weak, str)  # candidates are model names
        predictor = load_predictor(conf.get("predictor", "profiles/routers/win_predictor.json"))
        return decide(predictor.predict(request.prompt_text()), self.current_threshold(), strong, weak)


def calibrate(scores: list[float], strong_share: float) -> float:
    """The threshold that sends ``strong_share`` of the given traffic to the strong model."""
    if not scores:
        raise ValueError("no recorded threshold-router scores to calibrate on; route some traffic through it first")
    if not 0 < strong_share < 1:
        raise ValueError("--strong-share must be between 0 and 1")
    ordered = sorted(scores)
    k = min(len(ordered) - 1, max(0, int(round((1 - strong_share) * len(ordered)))))
    return ordered[k]
