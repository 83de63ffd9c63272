"""Settings shared by the router plugins (``[plugins.router]`` in tokenops.toml).

```toml
[plugins.router]
alias = "auto"        # the model name clients send to be routed (default "auto")
use = "profile"       # rules | semantic | profile | threshold
default = "small"     # when the active router has no opinion
```

Each router keeps its own table: ``[plugins.router.rules]``, ``[plugins.router.semantic]``,
``[plugins.router.profile]``, ``[plugins.router.threshold]``. A router answers only
requests for the alias and only when it is the one in ``use``; requests naming a
concrete model go to that model (``route_by_name``).
"""

from __future__ import annotations

from typing import Any

#: The models a plain ``serve`` runs when none are configured (read once: static, not configuration).
_state: dict[str, Any] = {"defaults": None}


def router_in_use(name: str) -> Any:
    """Relevance of router ``name``'s tunables: a deployment whose ``[plugins.router] use`` is that
    router (unknown configuration: kept). The routers own this fact; the tuner only calls it."""

    def relevant(deployment: Any) -> bool:
        use = deployment.plugin_setting("router", "use")
        return use is ... or use == name

    return relevant


class RouterConfig:
    """``[plugins.router]`` as one router plugin instance was configured with (each gateway's
    router instances hold their own)."""

    __slots__ = ("settings",)

    def __init__(self, settings: Any = None) -> None:
        self.settings = settings

    def configure(self, settings: Any) -> None:
        self.settings = settings

    def section(self, name: str | None = None) -> dict[str, Any]:
        conf = self.settings.plugin_settings("router") if self.settings is not None else {}
        if name is None:
            return conf
        value = conf.get(name, {})
        return value if isinstance(value, dict) else {}

    def is_active(self, router: str, request: Any) -> bool:
        conf = self.section()
        return conf.get("use") == router and request.model == conf.get("alias", "auto")

    def default_model(self, candidates: list[str]) -> str | None:
        model = self.section().get("default")
        return model if model in candidates else None

    def _model_configs(self) -> list[Any]:
        """The served models' configs: ``[[models]]``, or the defaults a plain ``serve`` runs
        (the demo models and the priced ladder) when none are configured."""
        models = list(getattr(self.settings, "models", []) or [])
        if models or self.settings is None:
            return models
        if _state.get("defaults") is None:
            from tokenops.backends.registry import default_model_configs

            _state["defaults"] = default_model_configs()
        return _state["defaults"]

    def model_cost(self, name: str) -> float:
        """Blended price per 1M tokens (input + 3x output, a typical chat mix)."""
        for m in self._model_configs():
            if m.name == name:
                return m.cost_input_per_1m + 3 * m.cost_output_per_1m
        return 0.0

    def by_cost(self, candidates: list[str]) -> list[str]:
        return sorted(candidates, key=lambda m: (self.model_cost(m), m))
