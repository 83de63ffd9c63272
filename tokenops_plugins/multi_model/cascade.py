"""Cascade: answer with the cheapest model, escalate to the next when the validators
score its answer below a threshold.

```toml
[plugins.cascade]
alias = "cascade"              # the model name clients send
models = ["small", "big"]      # increasing cost
threshold = 0.6                # minimum validator score to accept an answer
```

The pipeline does the escalation (``RouteDecision.escalate_to``) and records each tier
tried in the request's decisions (``escalated``, ``cascade``). Streaming requests: the
cascade needs whole answers to validate, so it runs to completion first (the cheap
tier, and the stronger ones it escalates to) and the accepted answer is then streamed
out as chunks; time to first token therefore includes every tier tried.
"""

from __future__ import annotations

from tokenops import hookimpl
from tokenops.tunables import Tunable
from tokenops.types import RouteDecision

TOKENOPS_LAYER = "multi_model"
#: The [plugins.<section>] tables this plugin reads and their keys: serve and tune refuse any other.
TOKENOPS_SETTINGS = {"cascade": ("alias", "models", "threshold")}

_DEFAULTS = {"alias": "cascade", "models": [], "threshold": 0.6}


def has_cascade(deployment) -> bool:
    """Relevance of the cascade's tunables: a deployment whose ``[plugins.cascade] models`` has 2+
    tiers (unknown configuration: kept). The cascade owns this fact; the tuner only calls it."""
    models = deployment.plugin_setting("cascade", "models", [])
    return models is ... or (isinstance(models, list) and len(models) >= 2)


class Cascade:
    """One gateway's cascade: its alias, tiers (cheapest first) and threshold."""

    TOKENOPS_LAYER = TOKENOPS_LAYER
    TOKENOPS_SETTINGS = TOKENOPS_SETTINGS

    def __init__(self) -> None:
        self.conf: dict = dict(_DEFAULTS)

    @hookimpl
    def tokenops_register_tunables(self, register):
        register(
            Tunable(
                "cascade.threshold",
                "float",
                0.6,
                "Cascade: minimum validator score to accept a cheaper tier's answer.",
                live=True,
                minimum=0.0,
                maximum=1.0,
                relevant=has_cascade,
                needs="a cascade ([plugins.cascade] models with 2+ tiers)",
            )
        )

    @hookimpl
    def tokenops_apply_tunables(self, values):
        if "cascade.threshold" in values:
            self.conf["threshold"] = float(values["cascade.threshold"])

    @hookimpl
    def tokenops_configure(self, settings):
        conf = settings.plugin_settings("cascade")
        if conf:  # a configured section replaces the whole cascade: keys it leaves out take their defaults
            self.conf.update(_DEFAULTS)
        for key in ("alias", "models", "threshold"):
            if key in conf:
                self.conf[key] = conf[key]
        if conf and len(self.conf["models"]) < 2:
            raise ValueError("[plugins.cascade] models needs at least two models, cheapest first")

    @hookimpl(tryfirst=True)
    def tokenops_route(self, request, candidates, profiles):
        conf = self.conf
        if request.model != conf["alias"] or not conf["models"]:
            return None
        tiers = [m for m in conf["models"] if m in candidates]
        if not tiers:
            return None
        return RouteDecision(
            tiers[0],
            f"cascade: tier 1 of {len(tiers)}",
            router="cascade",
            escalate_to=tuple(tiers[1:]),
            min_score=float(conf["threshold"]),
        )
