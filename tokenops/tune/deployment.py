"""What is being tuned: the models, their replicas and the plugin configuration of the
target, so the tuner searches only tunables that can change it.

A tunable declares ``relevant(deployment)`` (and ``needs``, the words for what it
needs); the cascade threshold needs a cascade, router knobs a router in use (predicates the
plugins own), replica policies a model with two or more replicas, diffusion knobs an images
workload on a diffusion model (predicates on the deployment's facts, here). The same facts come from every way the tuner reaches its target: a
server of this folder (its store channel's ``hello``), a server given by ``--url`` (the
``deployment`` object of ``GET /admin/tunables``, built by the same function) and a
launched engine. A fact the tuner could not learn (a URL that is not a tokenops server)
is None and keeps every tunable that depends on it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tokenops.tunables import Tunable


@dataclass(slots=True)
class Deployment:
    #: model name -> number of replicas (None: unknown)
    replicas: dict[str, int] | None = None
    #: the server's ``[plugins]`` configuration (None: unknown)
    plugins: dict[str, Any] | None = None
    #: model name -> backend kind (local, openai, diffusion, ...; None: unknown)
    kinds: dict[str, str] | None = None
    #: the kinds of work the measured workload sends ("text", "images"; None: unknown)
    work: set[str] | None = None

    @classmethod
    def from_settings(cls, settings: Any) -> Deployment:
        from tokenops.backends.registry import model_configs, replica_urls

        models = model_configs(settings)
        return cls(
            {m.name: len(replica_urls(m)) for m in models}, dict(settings.plugins), {m.name: m.backend for m in models}
        )

    @classmethod
    def from_server_info(cls, info: dict[str, Any] | None, work: set[str] | None = None) -> Deployment:
        """From :func:`server_facts` as a server reports them (its store channel's ``hello``
        or ``GET /admin/tunables``); None (not a tokenops server) keeps everything unknown."""
        info = info or {}
        replicas, kinds, plugins = info.get("replicas"), info.get("kinds"), info.get("plugins")
        return cls(
            dict(replicas) if isinstance(replicas, dict) else None,
            dict(plugins) if isinstance(plugins, dict) else None,
            dict(kinds) if isinstance(kinds, dict) else None,
            work,
        )

    @property
    def num_models(self) -> int | None:
        return None if self.replicas is None else len(self.replicas)

    @property
    def max_replicas(self) -> int | None:
        return None if self.replicas is None else max(self.replicas.values(), default=0)

    def plugin_setting(self, plugin: str, key: str, default: Any = None) -> Any:
        """``[plugins.<plugin>] <key>``; ``...`` (Ellipsis) when the configuration is unknown."""
        if self.plugins is None:
            return ...
        section = self.plugins.get(plugin)
        return section.get(key, default) if isinstance(section, dict) else default

    def describe(self) -> str:
        if self.replicas is None:
            return "deployment unknown"
        parts = [f"{name} x{n}" if n > 1 else name for name, n in self.replicas.items()]
        return f"{len(self.replicas)} model(s): {', '.join(parts)}"


def server_facts(settings: Any, replicas: dict[str, int], kinds: dict[str, str]) -> dict[str, Any]:
    """What a running server tells the tuner about itself, on every path (one builder, so the
    socket and ``--url`` paths decide alike): models' replica counts, backend kinds, ``[plugins]``."""
    return {"replicas": dict(replicas), "kinds": dict(kinds), "plugins": dict(settings.plugins)}


#: bench/tune endpoints -> the kind of work they send
WORK_OF_ENDPOINT = {"chat": "text", "completions": "text", "images": "images"}


def work_of(endpoint: str) -> set[str]:
    return {WORK_OF_ENDPOINT.get(endpoint, "text")}


# -- predicates on the deployment's own facts (replicas, backend kinds, workload) that plugins attach
# to their tunables; a predicate on a plugin's own configuration lives in that plugin (cascade.py's
# has_cascade, the routers' router_in_use), as a third-party plugin's would ----------------------


def has_replicated_model(d: Deployment) -> bool:
    return d.max_replicas is None or d.max_replicas >= 2


def has_backend(kind: str):
    def relevant(d: Deployment) -> bool:
        return d.kinds is None or kind in d.kinds.values()

    return relevant


def does_work(kind: str):
    """Relevant only when the measured workload sends ``kind`` work ("text", "images")."""

    def relevant(d: Deployment) -> bool:
        return d.work is None or kind in d.work

    return relevant


def serves_work(kind: str, backend: str):
    """Relevant when a ``backend`` model is served *and* the workload sends ``kind`` work:
    a knob of images measured by a chat workload would be a value the study never measured."""
    has, does = has_backend(backend), does_work(kind)
    return lambda d: has(d) and does(d)


#: ``**DIFFUSION`` in a ``Tunable(...)``: it matters only for images work on a diffusion model.
DIFFUSION = {
    "relevant": serves_work("images", "diffusion"),
    "needs": 'images in the workload, served by a diffusion model ([[models]] backend = "diffusion")',
}


@dataclass(slots=True)
class Relevance:
    kept: list[Tunable] = field(default_factory=list)
    #: (name, why it was left out)
    dropped: list[tuple[str, str]] = field(default_factory=list)


def filter_relevant(
    tunables: Iterable[Tunable], deployment: Deployment, declared: Any = None, keep: Iterable[str] = ()
) -> Relevance:
    """Split ``tunables`` into those that can change ``deployment`` and those that cannot.

    :param declared: a registry to read ``relevant``/``needs`` from by name (tunables rebuilt
        from a server's JSON carry no code).
    :param keep: names kept regardless (the user asked for them with ``--param``).
    """
    keep = set(keep)
    out = Relevance()
    for t in tunables:
        source = declared[t.name] if declared is not None and t.name in declared else t
        check = source.relevant
        if check is None or t.name in keep or check(deployment):
            out.kept.append(t)
        else:
            out.dropped.append((t.name, f"needs {source.needs or 'another deployment'}"))
    return out
