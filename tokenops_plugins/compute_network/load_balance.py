"""Replica selection beyond round robin: least load, power of two choices,
session-sticky (consistent hashing with bounded loads), prefix-cache-aware and
KV-aware. Off by default: ``routing.replica_policy = round_robin`` leaves the
choice to the gateway's round robin. Turn on with the live tunable or
``[plugins.load_balance] policy = "prefix_aware"`` in tokenops.toml.
"""

from __future__ import annotations

import dataclasses

from tokenops import hookimpl
from tokenops.routing.selector import POLICIES, ReplicaSelector
from tokenops.tunables import Tunable, TunableError

TOKENOPS_LAYER = "compute_network"
#: The [plugins.<section>] tables this plugin reads and their keys: serve and tune refuse any other.
TOKENOPS_SETTINGS = {
    "load_balance": (
        "policy",
        "sticky_load_factor",
        "prefix_load_weight",
        "prefix_load_factor",
        "prefix_block_chars",
        "prefix_max_blocks",
        "kv_block_size",
        "seed",
    )
}

#: tunable name -> SelectorConfig field
FIELDS = {
    "routing.replica_policy": "policy",
    "routing.sticky_load_factor": "sticky_load_factor",
    "routing.prefix_load_weight": "prefix_load_weight",
    "routing.prefix_load_factor": "prefix_load_factor",
    "routing.prefix_block_chars": "prefix_block_chars",
    "routing.prefix_max_blocks": "prefix_max_blocks",
}


def _replicated() -> dict:
    from tokenops.tune.deployment import has_replicated_model

    return {"relevant": has_replicated_model, "needs": "a model with 2+ replicas to balance"}


class LoadBalance:
    """One gateway's replica selector: its policy and what it tracks (loads, prefixes, sessions)."""

    TOKENOPS_LAYER = TOKENOPS_LAYER
    TOKENOPS_SETTINGS = TOKENOPS_SETTINGS

    def __init__(self) -> None:
        self.selector = ReplicaSelector()

    def apply(self, values: dict) -> dict:
        """Apply ``{tunable or field name: value}``; returns what changed. Raises TunableError."""
        changes = {}
        for name, value in values.items():
            field = FIELDS.get(name) or FIELDS.get(f"routing.{name}") or (name if name in FIELDS.values() else None)
            if field is not None:
                changes[field] = value
        if not changes:
            return {}
        try:
            config = dataclasses.replace(self.selector.config, **changes)
        except (TypeError, ValueError) as e:
            raise TunableError(f"load_balance: {e}") from None
        if config.prefix_block_chars != self.selector.config.prefix_block_chars:
            self.selector.prefix_index.clear()
        self.selector.prefix_index.max_blocks = self.selector.kv_index.max_blocks = config.prefix_max_blocks
        self.selector.config = config
        return changes

    @hookimpl
    def tokenops_register_tunables(self, register):
        register_tunables(register)

    @hookimpl
    def tokenops_configure(self, settings):
        try:
            self.apply(settings.plugin_settings("load_balance"))
        except TunableError as e:
            from tokenops.config import ConfigError

            raise ConfigError(f"[plugins.load_balance]: {e}") from None

    @hookimpl
    def tokenops_apply_tunables(self, values):
        self.apply({k: v for k, v in values.items() if k in FIELDS})

    @hookimpl
    def tokenops_select_replica(self, request, replicas):
        return self.selector.select(request, replicas)

    @hookimpl
    def tokenops_backend_outcome(self, backend, outcome):
        self.selector.finished(backend, outcome.prompt_tokens, outcome.completion_tokens)


def register_tunables(register) -> None:
    replicated = _replicated()
    register(
        Tunable(
            "routing.replica_policy",
            "str",
            "round_robin",
            "How a model's replica is chosen.",
            live=True,
            choices=POLICIES,
            **replicated,
        )
    )
    register(
        Tunable(
            "routing.sticky_load_factor",
            "float",
            1.25,
            "Sticky routing: a replica takes at most this times the mean in-flight requests.",
            live=True,
            minimum=1.0,
            maximum=4.0,
            **replicated,
        )
    )
    register(
        Tunable(
            "routing.prefix_load_weight",
            "float",
            0.5,
            "Prefix/KV-aware: weight of normalised load against matched-prefix fraction.",
            live=True,
            minimum=0.0,
            maximum=5.0,
            **replicated,
        )
    )
    register(
        Tunable(
            "routing.prefix_load_factor",
            "float",
            1.25,
            "Prefix/KV-aware: replicas above this times the mean outstanding tokens are skipped.",
            live=True,
            minimum=1.0,
            maximum=4.0,
            **replicated,
        )
    )
    register(
        Tunable(
            "routing.prefix_block_chars",
            "int",
            64,
            "Prefix-aware: characters per prefix-tree block.",
            live=True,
            minimum=8,
            maximum=4096,
            searchable=False,
            **replicated,
        )
    )
    register(
        Tunable(
            "routing.prefix_max_blocks",
            "int",
            16384,
            "Prefix-aware: blocks remembered per replica (LRU).",
            live=True,
            minimum=64,
            maximum=10_000_000,
            log=True,
            searchable=False,
            **replicated,
        )
    )
