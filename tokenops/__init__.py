"""tokenops: token operations — serve LLM tokens cheaply, fast and reliably."""

import pluggy

__version__ = "0.1.0"

#: Decorator for plugin hook implementations: ``@hookimpl def tokenops_route(...)``.
hookimpl = pluggy.HookimplMarker("tokenops")

from tokenops.blocking import may_block  # noqa: E402  (``@may_block``: this implementation may block the event loop)

__all__ = ["hookimpl", "may_block", "__version__"]
