"""Backends: the :class:`Backend` protocol, the bundled engine (``local``) and
OpenAI-compatible servers (``openai``). Kinds are contributed by plugins through
``tokenops_register_backends``."""

from tokenops.backends.base import Backend, Delta, Replica, collect

__all__ = ["Backend", "Delta", "Replica", "collect"]
