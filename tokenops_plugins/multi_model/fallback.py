"""Fallback chains: when a model fails (error, timeout, overload, context length), try
the next model of its chain that has not been tried for this request.

```toml
[plugins.fallback.chains]
big = ["medium", "small"]
small = ["big"]          # e.g. a context-length failure on the small model goes to the big one
```

The chain is the one of the model the request was routed to; each failure moves to its
next untried entry.

``[plugins.fallback] on = ["error", "timeout", "overload", "context_length", "unavailable"]``
limits which failures fall back (default: all of these; ``bad_request`` never does).
"""

from __future__ import annotations

from tokenops import hookimpl

TOKENOPS_LAYER = "multi_model"
#: The [plugins.<section>] tables this plugin reads and their keys: serve and tune refuse any other.
TOKENOPS_SETTINGS = {"fallback": ("chains", "on")}
DEFAULT_ON = ("error", "timeout", "overload", "context_length", "unavailable")


class Fallback:
    """One gateway's fallback chains and the error kinds that follow them."""

    TOKENOPS_LAYER = TOKENOPS_LAYER
    TOKENOPS_SETTINGS = TOKENOPS_SETTINGS

    def __init__(self) -> None:
        self.chains: dict[str, list[str]] = {}
        self.on: tuple[str, ...] = DEFAULT_ON

    @hookimpl
    def tokenops_configure(self, settings):
        conf = settings.plugin_settings("fallback")
        self.chains = dict(conf.get("chains", {}))
        self.on = tuple(conf.get("on", DEFAULT_ON))

    def next_model(self, attempts: list[str], error_kind: str) -> str | None:
        """The next untried model of the chain of the first model tried (the routed one)."""
        if error_kind not in self.on:
            return None
        for model in self.chains.get(attempts[0], []):
            if model not in attempts:
                return model
        return None

    @hookimpl
    def tokenops_fallback(self, request, error):
        if not request.attempts:
            return None
        return self.next_model(request.attempts, getattr(error, "kind", "error"))
