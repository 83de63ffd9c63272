"""tokenops: token operations — serve LLM tokens cheaply, fast and reliably."""

import pluggy

__version__ = "0.1.0"

#: Decorator for plugin hook implementations: ``@hookimpl def tokenops_route(...)``.
hookimpl = pluggy.HookimplMarker("tokenops")

__all__ = ["hookimpl", "__version__"]
