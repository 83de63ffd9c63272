"""Rules router: the first rule whose conditions all hold picks the model.

```toml
[plugins.router]
use = "rules"
default = "small"
[[plugins.router.rules.rules]]
regex = "(?i)\\b(prove|derive|theorem)\\b"
model = "big"
[[plugins.router.rules.rules]]
keywords = ["json", "extract"]
max_chars = 2000
model = "small"
[[plugins.router.rules.rules]]
tenant = "premium"
model = "big"
```

Conditions: ``regex`` (searched in the request text), ``keywords`` (any, case-insensitive),
``min_chars`` / ``max_chars`` (request text length), ``tenant``; ``model`` (requested model
name) matches the name the client sent when rules are used without the alias.
"""

from __future__ import annotations

import re

from tokenops import hookimpl
from tokenops.types import RouteDecision

from ._router_config import RouterConfig

TOKENOPS_LAYER = "multi_model"
#: The [plugins.<section>] tables this plugin reads and their keys: serve and tune refuse any other.
TOKENOPS_SETTINGS = {"router": ("use", "alias", "default", "rules")}


def _matches(rule: dict, request, text: str) -> bool:
    if "regex" in rule and not re.search(rule["regex"], text):
        return False
    if "keywords" in rule and not any(k.lower() in text.lower() for k in rule["keywords"]):
        return False
    if "min_chars" in rule and len(text) < int(rule["min_chars"]):
        return False
    if "max_chars" in rule and len(text) > int(rule["max_chars"]):
        return False
    return "tenant" not in rule or request.tenant == rule["tenant"]


def _describe(i: int, rule: dict) -> str:
    conds = ", ".join(
        f"{k}={rule[k]!r}" for k in ("regex", "keywords", "min_chars", "max_chars", "tenant") if k in rule
    )
    return f"rule #{i + 1} ({conds or 'always'})"


class RulesRouter:
    """The rules router of one gateway (its own ``[plugins.router]``)."""

    TOKENOPS_LAYER = TOKENOPS_LAYER
    TOKENOPS_SETTINGS = TOKENOPS_SETTINGS

    def __init__(self) -> None:
        self.rc = RouterConfig()

    @hookimpl
    def tokenops_configure(self, settings):
        rules = RouterConfig(settings).section("rules").get("rules", [])
        for i, rule in enumerate(rules):
            if "model" not in rule:
                raise ValueError(f"[plugins.router.rules] rule #{i + 1} has no model")
            if "regex" in rule:
                re.compile(rule["regex"])
        self.rc.configure(settings)

    @hookimpl
    def tokenops_route(self, request, candidates, profiles):
        rc = self.rc
        if not rc.is_active("rules", request):
            return None
        text = request.prompt_text()
        for i, rule in enumerate(rc.section("rules").get("rules", [])):
            if rule["model"] in candidates and _matches(rule, request, text):
                return RouteDecision(model=rule["model"], reason=f"rules: {_describe(i, rule)}", router="rules")
        default = rc.default_model(candidates)
        if default is None:
            return None
        return RouteDecision(model=default, reason="rules: no rule matched, default", router="rules")
