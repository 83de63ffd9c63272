"""Profile router: classify which capability a request needs, then pick the cheapest
model whose measured profile score for it clears a threshold.

```toml
[plugins.router]
use = "profile"
[plugins.router.profile]
threshold = 0.9        # minimum score on the request's dimension
lower_bound = false    # compare the Wilson lower bound instead of the point estimate
max_error_rate = 0.2   # skip models whose running error rate (profile_telemetry) is higher
```

The dimension classifier is a naive-Bayes text model trained on the generated task
suites (``_suites.py``), so it needs no data file. Profiles come from
``tokenops profile run MODEL`` (``profiles/models/*.toml``).
"""

from __future__ import annotations

from functools import lru_cache

from tokenops import hookimpl, may_block
from tokenops.types import RouteDecision

from ._profiles import dimension_score
from ._router_config import RouterConfig
from ._suites import make_mixed
from ._text_model import NaiveBayes

TOKENOPS_LAYER = "multi_model"
#: The [plugins.<section>] tables this plugin reads and their keys: serve and tune refuse any other.
TOKENOPS_SETTINGS = {"router": ("use", "alias", "default", "profile")}


@lru_cache(maxsize=1)
def dimension_classifier() -> NaiveBayes:
    tasks = make_mixed(30, seed=20261121)
    return NaiveBayes().fit([t.prompt for t in tasks], [t.dimension for t in tasks])


def choose(
    text: str,
    candidates: list[str],
    profiles: dict,
    threshold: float,
    lower_bound: bool = False,
    max_error_rate: float = 1.0,
    config: RouterConfig | None = None,
) -> RouteDecision | None:
    """The cheapest candidate (prices of ``config``'s models) whose profile clears ``threshold``
    on the prompt's dimension, else the best scored one; None without profiles."""
    from .profile_telemetry import running_stats

    dimension = dimension_classifier().predict(text)
    healthy = [m for m in candidates if running_stats(m).get("error_rate", 0.0) <= max_error_rate] or candidates
    maybe_scored = [
        (m, dimension_score(profiles.get(m), dimension, lower_bound))
        for m in (config or RouterConfig()).by_cost(healthy)
    ]
    scored = [(m, s) for m, s in maybe_scored if s is not None]
    if not scored:
        return None
    for model, score in scored:
        if score >= threshold:
            return RouteDecision(
                model,
                f"profile: {dimension} -> cheapest with score {score:.2f} >= {threshold:.2f}",
                router="profile",
                score=score,
            )
    model, score = max(scored, key=lambda ms: ms[1])
    return RouteDecision(
        model, f"profile: {dimension} -> none clears {threshold:.2f}, best {score:.2f}", router="profile", score=score
    )


class ProfileRouter:
    """The profile router of one gateway (its own ``[plugins.router]``)."""

    TOKENOPS_LAYER = TOKENOPS_LAYER
    TOKENOPS_SETTINGS = TOKENOPS_SETTINGS

    def __init__(self) -> None:
        self.rc = RouterConfig()

    @hookimpl
    def tokenops_configure(self, settings):
        self.rc.configure(settings)

    def is_active(self, request) -> bool:
        return self.rc.is_active("profile", request)

    @hookimpl
    @may_block(when=lambda self, request: self.is_active(request))  # classifies the prompt (~0.8 ms per KB)
    def tokenops_route(self, request, candidates, profiles):
        if not self.is_active(request):
            return None
        conf = self.rc.section("profile")
        decision = choose(
            request.prompt_text(),
            candidates,
            profiles,
            float(conf.get("threshold", 0.9)),
            bool(conf.get("lower_bound", False)),
            float(conf.get("max_error_rate", 0.2)),
            self.rc,
        )
        if decision is None and (default := self.rc.default_model(candidates)):
            return RouteDecision(default, "profile: no profiles loaded, default", router="profile")
        return decision
