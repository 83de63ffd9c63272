"""Replica-selection policies and the state they share.

``round_robin`` is the gateway's default and is left to it (``select`` returns
None). The others:

- ``least_load``: fewest outstanding tokens (prompt + ``max_tokens`` in flight).
- ``p2c``: power of two choices: two random replicas, the less loaded one wins.
- ``sticky``: the request's session (``x-session-id`` / ``user``) is consistently
  hashed to a replica, with bounded loads (``sticky_load_factor`` x mean in-flight).
- ``prefix_aware``: an approximate prefix tree over character blocks of the prompt;
  ``score = matched_fraction - prefix_load_weight * load / capacity`` among replicas
  under the bounded-load capacity (``prefix_load_factor`` x the mean load, where
  load = outstanding tokens + tokens given lately, decayed over ~30 s),
  so affinity and load are traded in one score rather than switched between.
- a request with a ``prompt_cache_key`` goes where its key is consistently hashed (bounded
  loads, as ``sticky``) under every policy but the load-only ``least_load`` and ``p2c``,
  round robin included: the client says which requests share a prefix.
- ``kv_aware``: the same score over the engine's own unit: chained hashes of
  ``block_size``-token blocks of the tokenized prompt salted by tenant (the bundled
  engine's prefix-cache key), each replica bounded by its ``kv_blocks_total``.
  The engine does not publish its block hashes, so the gateway recomputes them
  and remembers where it sent them: an approximation that misses engine-side
  evictions caused by other traffic.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenops.routing.estimate import cache_key, estimate_prompt_tokens, request_text, session_key
from tokenops.routing.hash_ring import HashRing
from tokenops.routing.load_tracker import LoadTracker
from tokenops.routing.prefix_index import PrefixIndex, blocks_of, chained_hashes

POLICIES = ("round_robin", "least_load", "p2c", "sticky", "prefix_aware", "kv_aware")
#: Affinity looks at the first this many characters of a prompt (about 4k tokens): selection
#: runs on the event loop, and hashing or tokenizing a 4 MB prompt there stalled every
#: request for 0.3-1.4 s. Prefixes that agree this far rarely diverge in cache value.
MAX_AFFINITY_CHARS = 16384


@dataclass(slots=True)
class SelectorConfig:
    policy: str = "round_robin"
    sticky_load_factor: float = 1.25
    prefix_load_weight: float = 0.5
    prefix_load_factor: float = 1.25
    prefix_block_chars: int = 64
    prefix_max_blocks: int = 16384
    kv_block_size: int = 16
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"routing policy {self.policy!r} is not one of {', '.join(POLICIES)}")
        if self.sticky_load_factor < 1.0 or self.prefix_load_factor < 1.0:
            raise ValueError("load factors must be >= 1.0 (1.0 = perfectly even)")
        if self.prefix_load_weight < 0:
            raise ValueError("prefix_load_weight must be >= 0")
        if self.prefix_block_chars < 1 or self.prefix_max_blocks < 1 or self.kv_block_size < 1:
            raise ValueError("block sizes and prefix_max_blocks must be >= 1")


def _head_messages(messages: list[dict[str, Any]], max_chars: int) -> list[dict[str, Any]]:
    """The leading messages holding the first ``max_chars`` characters of content (the last one cut)."""
    out, used = [], 0
    for m in messages:
        content = m.get("content")
        if isinstance(content, str) and used + len(content) > max_chars:
            out.append({**m, "content": content[: max(0, max_chars - used)]})
            break
        out.append(m)
        used += len(content) if isinstance(content, str) else 0
        if used >= max_chars:
            break
    return out


def _engine_of(replica: Any) -> Any:
    backend = getattr(replica, "backend", None)
    return getattr(backend, "engine", None) or backend


class ReplicaSelector:
    """Chooses a replica per request and keeps the load and prefix state behind it."""

    def __init__(self, config: SelectorConfig | None = None, tracker: LoadTracker | None = None) -> None:
        self.config = config or SelectorConfig()
        self.tracker = tracker or LoadTracker()
        self.prefix_index = PrefixIndex(self.config.prefix_max_blocks)
        self.kv_index = PrefixIndex(self.config.prefix_max_blocks)
        self._rng = random.Random(self.config.seed)
        self._rings: dict[tuple[str, ...], HashRing] = {}
        self._turn = 0
        self._lock = threading.Lock()

    # -- entry points ----------------------------------------------------------------

    def select(self, request: Any, replicas: Sequence[Any]) -> Any:
        """The chosen replica, or None for round robin / no replicas."""
        policy = self.config.policy
        key = cache_key(request) if policy not in ("least_load", "p2c") else None
        if not replicas or (policy == "round_robin" and (key is None or len(replicas) == 1)):
            return None
        if len(replicas) == 1:
            chosen, reason = replicas[0], policy
        elif key is not None:
            chosen, reason = self._keyed(key, replicas, "cache_key")
        else:
            chosen, reason = getattr(self, f"_select_{policy}")(request, replicas)
        decide = getattr(request, "decide", None)  # a GatewayRequest (the bench's requests have no record)
        if decide is not None:
            decide("replica_policy", reason)
            decide("replica", chosen.name)
        self.tracker.start(
            chosen.name,
            getattr(request, "id", ""),
            estimate_prompt_tokens(request),
            int(getattr(request, "max_tokens", 0) or 0),
        )
        return chosen

    def finished(self, replica: str, prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
        self.tracker.finish(replica, prompt_tokens or None, completion_tokens)

    # -- load-only policies ----------------------------------------------------------

    def _load(self, replica: Any) -> int:
        return self.tracker.outstanding_tokens(replica.name)

    def _select_least_load(self, request: Any, replicas: Sequence[Any]) -> tuple[Any, str]:
        with self._lock:
            self._turn += 1
            turn = self._turn
        n = len(replicas)
        # rotate ties so an idle pool is used evenly
        order = [replicas[(turn + i) % n] for i in range(n)]
        return min(order, key=lambda r: (self._load(r), self.tracker.num_in_flight(r.name))), "least_load"

    def _select_p2c(self, request: Any, replicas: Sequence[Any]) -> tuple[Any, str]:
        with self._lock:
            a, b = self._rng.sample(range(len(replicas)), 2)
        ra, rb = replicas[a], replicas[b]
        return (ra if self._load(ra) <= self._load(rb) else rb), "p2c"

    def _select_sticky(self, request: Any, replicas: Sequence[Any]) -> tuple[Any, str]:
        key = session_key(request)
        if key is None:
            chosen, _ = self._select_least_load(request, replicas)
            return chosen, "sticky:no_session"
        return self._keyed(key, replicas, "sticky")

    def _keyed(self, key: str, replicas: Sequence[Any], label: str) -> tuple[Any, str]:
        """The replica ``key`` hashes to, or the next one under the bounded load."""
        ring = self._ring([r.name for r in replicas])
        by_name = {r.name: r for r in replicas}
        name = ring.lookup_bounded(key, self.tracker.num_in_flight, self.config.sticky_load_factor)
        home = ring.lookup(key)
        return by_name[name], (label if name == home else f"{label}:overflow")

    def _ring(self, names: list[str]) -> HashRing:
        key = tuple(sorted(names))
        with self._lock:
            ring = self._rings.get(key)
            if ring is None:
                if len(self._rings) > 64:
                    self._rings.clear()
                ring = self._rings[key] = HashRing(key)
            return ring

    # -- cache-affinity policies -----------------------------------------------------

    def _select_prefix_aware(self, request: Any, replicas: Sequence[Any]) -> tuple[Any, str]:
        text = request_text(request)[:MAX_AFFINITY_CHARS]
        hashes = chained_hashes(blocks_of(text, self.config.prefix_block_chars), salt=getattr(request, "tenant", None))
        chosen, reason = self._best_affinity(request, replicas, hashes, self.prefix_index, "prefix")
        self.prefix_index.insert(chosen.name, hashes)
        return chosen, reason

    def _select_kv_aware(self, request: Any, replicas: Sequence[Any]) -> tuple[Any, str]:
        engine = _engine_of(replicas[0])
        block_size = getattr(getattr(engine, "config", None), "block_size", None) or self.config.kv_block_size
        tokens = self._tokens(request, engine)
        hashes = chained_hashes(
            (tuple(b) for b in blocks_of(tokens, block_size)), salt=getattr(request, "tenant", None)
        )
        for r in replicas:
            total = self._kv_blocks_total(r)
            if total:
                self.kv_index.set_capacity(r.name, total)
        chosen, reason = self._best_affinity(request, replicas, hashes, self.kv_index, "kv")
        self.kv_index.insert(chosen.name, hashes)
        return chosen, reason

    @staticmethod
    def _kv_blocks_total(replica: Any) -> int | None:
        stats_fn = getattr(_engine_of(replica), "stats", None)
        try:
            stats = stats_fn() if callable(stats_fn) else None
        except Exception:  # a remote backend may fail to answer; fall back to the default bound
            return None
        value = (stats or {}).get("kv_blocks_total")
        return int(value) if value else None

    @staticmethod
    def _tokens(request: Any, engine: Any) -> list[int]:
        prompt = getattr(request, "prompt", None)
        if isinstance(prompt, list):
            return list(prompt[: MAX_AFFINITY_CHARS // 4])
        tokenizer = getattr(engine, "tokenizer", None)
        if tokenizer is not None:
            messages = getattr(request, "messages", None)
            if messages is not None:
                messages = _head_messages(messages, MAX_AFFINITY_CHARS)
            text = tokenizer.apply_chat_template(messages) if messages is not None else (prompt or "")
            return list(tokenizer.encode(text[:MAX_AFFINITY_CHARS]))
        # no tokenizer at hand (remote backend): ~4 bytes per token
        data = request_text(request)[:MAX_AFFINITY_CHARS].encode()
        return [int.from_bytes(data[i : i + 4], "little") for i in range(0, len(data), 4)]

    def _best_affinity(
        self, request: Any, replicas: Sequence[Any], hashes: list[int], index: PrefixIndex, label: str
    ) -> tuple[Any, str]:
        # in flight plus lately given: cache affinity must not pile up work between bursts either
        loads = {r.name: self._load(r) + self.tracker.recent_tokens(r.name) for r in replicas}
        cost = estimate_prompt_tokens(request) + int(getattr(request, "max_tokens", 0) or 0)
        # like ceil(c * (m + 1) / n) in Mirrokni et al.: one request of slack, so light traffic can still stick
        capacity = self.config.prefix_load_factor * (sum(loads.values()) + cost) / len(replicas) + cost
        eligible = [r for r in replicas if loads[r.name] <= capacity] or list(replicas)
        matched = index.match(hashes, [r.name for r in eligible])
        num_blocks = max(1, len(hashes))
        with self._lock:
            self._turn += 1
            turn = self._turn

        def score(item: tuple[int, Any]) -> tuple[float, int]:
            i, r = item
            affinity = matched[r.name] / num_blocks
            # ties (an idle pool, a cold prefix) rotate instead of piling onto one replica
            return affinity - self.config.prefix_load_weight * loads[r.name] / max(capacity, 1.0), -(
                (i - turn) % len(eligible)
            )

        _, best = max(enumerate(eligible), key=score)
        reason = f"{label}_hit" if matched[best.name] else f"{label}_miss"
        if len(eligible) < len(replicas):
            reason += ":bounded"
        return best, reason
