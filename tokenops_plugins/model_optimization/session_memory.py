"""Session memory (layer 2, gateway): long conversations get recalled context instead of
``context_length_exceeded``.

A session is ``(tenant, session id)``; the session id is the ``x-session-id`` header or
the request's ``user`` field. Every chat turn of a session is stored with an embedding
(the packaged all-MiniLM-L6-v2; :mod:`tokenops.memory.memory_store`), the answers too. When the
conversation plus the completion no longer fits the routed model's context (or
``token_budget``), the oldest turns are dropped and the stored entries most similar to
the last message are injected as one system message, within the budget
(:mod:`tokenops.memory.fit`). Requests without a session id are left alone.

Off by default. ``tokenops.toml``::

    [plugins.session_memory]
    enabled = true
    ttl_s = 3600              # entries expire this long after they were last seen
    max_session_kb = 1024     # per-session byte budget (text + vectors); oldest-seen go first
    max_total_mb = 256        # all sessions of this process together; least recently used go first
    token_budget = 0          # 0: the model's context; else the smaller of the two
    reserve_tokens = 128      # room kept for the completion when the request sets no max_tokens
    embedder = "auto"         # auto (MiniLM when installed), minilm, lexical

Admin: ``/admin/memory/...`` (tokenops/gateway/admin/admin_memory.py). Memory lives in the
server process only: it does not survive a restart.
"""

from __future__ import annotations

from typing import Any

from tokenops import hookimpl
from tokenops.memory.fit import fit_conversation, message_text
from tokenops.memory.memory_store import SessionMemory, get_session_memory, set_session_memory
from tokenops.tunables import Tunable

TOKENOPS_LAYER = "model_optimization"
#: The [plugins.<section>] tables this plugin reads and their keys: serve and tune refuse any other.
TOKENOPS_SETTINGS = {
    "session_memory": (
        "enabled",
        "ttl_s",
        "max_session_kb",
        "max_total_mb",
        "max_sessions",
        "token_budget",
        "reserve_tokens",
        "recent_share",
        "embedder",
        "chunk_chars",
        "max_recalled",
        "min_score",
    )
}

_DEFAULTS: dict[str, Any] = {
    "enabled": False,
    "ttl_s": 3600.0,
    "max_session_kb": 1024,
    "max_total_mb": 256,
    "max_sessions": 10_000,
    "token_budget": 0,
    "reserve_tokens": 128,
    "recent_share": 0.5,
    "embedder": "auto",
    "chunk_chars": 400,
    "max_recalled": 32,
    "min_score": 0.0,
}


class SessionMemoryPlugin:
    """One gateway's session-memory settings and background writer (each gateway has its own
    instance; the memory itself sits in the gateway's slot, :func:`set_session_memory`)."""

    TOKENOPS_LAYER = TOKENOPS_LAYER
    TOKENOPS_SETTINGS = TOKENOPS_SETTINGS

    def __init__(self) -> None:
        self.conf: dict[str, Any] = dict(_DEFAULTS)
        self._executor: Any = None

    @hookimpl
    def tokenops_register_tunables(self, register):
        register_tunables(register)

    @hookimpl
    def tokenops_configure(self, settings):
        values = checked(settings)
        self.conf.update(values)
        if not values["enabled"]:
            set_session_memory(None)
            return
        from tokenops.semcache.embedders import get_embedder

        embedder = get_embedder(values["embedder"])  # MiniLM loads on first use, in a worker thread
        limits = {
            "ttl_s": float(values["ttl_s"]),
            "max_session_bytes": values["max_session_kb"] * 1024,
            "max_sessions": values["max_sessions"],
            "chunk_chars": values["chunk_chars"],
            "max_total_bytes": values["max_total_mb"] << 20,
        }
        shared = getattr(settings, "shared", None)
        if shared is None:
            set_session_memory(SessionMemory(embedder.embed, **limits))
            return
        from tokenops.shared_state import open_session_memory

        # [shared] redis_url: every replica remembers and recalls the same sessions (docs/deploy.md)
        set_session_memory(open_session_memory(shared, embedder.embed, **limits))

    @hookimpl
    def tokenops_apply_tunables(self, values):
        memory = get_session_memory()
        if "session_memory.token_budget" in values:
            self.conf["token_budget"] = values["session_memory.token_budget"]
        if memory is not None:
            if "session_memory.ttl_s" in values:
                memory.ttl_s = float(values["session_memory.ttl_s"])
            if "session_memory.max_session_kb" in values:
                memory.max_session_bytes = values["session_memory.max_session_kb"] * 1024

    @hookimpl
    def tokenops_fit_context(self, request, window):
        memory = get_session_memory()
        if memory is None or not request.session_id or not request.messages:
            return None
        conf = self.conf
        tenant, session = request.tenant, request.session_id
        result: dict[str, Any] = {
            "session": session,
            "stored": memory.remember(tenant, session, _turns(request.messages)),
        }
        limits = [x for x in (window.max_model_len, conf["token_budget"]) if x]
        if not limits:
            return result
        asked = request.max_tokens if request.sampling.is_max_tokens_sent else None  # the client's limit, if sent
        budget = min(limits) - (asked or conf["reserve_tokens"])
        if budget <= 0 or window.count_tokens(request.messages) <= budget:
            return result
        query = message_text(request.messages[-1])
        recalled = [
            (e.role, e.text)
            for score, e in memory.recall(tenant, session, query)[: conf["max_recalled"]]
            if score >= conf["min_score"]
        ]
        fitted = fit_conversation(request.messages, budget, window.count_tokens, recalled, conf["recent_share"])
        if fitted is None:
            result["fitted"] = False  # even the system messages and the last one do not fit: the backend says so
            return result
        request.messages, info = fitted
        if "messages" in request.body:  # upstream backends send the body
            request.body = {**request.body, "messages": request.messages}
        result.update(info, fitted=True)
        return result

    @hookimpl
    def tokenops_cache_store(self, request, response):
        """The answer is a turn of the session too (clients that resend it are deduplicated)."""
        memory = get_session_memory()
        if memory is None or request.kind != "chat" or not request.session_id or not response.text:
            return
        # on the event loop here: embed in the background
        self._background().submit(memory.remember, request.tenant, request.session_id, [("assistant", response.text)])

    @hookimpl
    def tokenops_tenant_deleted(self, tenant, store):
        """A deleted tenant's sessions are forgotten (after turns still being stored land)."""
        memory = get_session_memory()
        if memory is None:
            return None
        if self._executor is not None:
            self._executor.submit(lambda: None).result()  # one worker: earlier stores have run
        return {"session_memory_entries": memory.delete_tenant(tenant)}

    def _background(self) -> Any:
        if self._executor is None:
            from concurrent.futures import ThreadPoolExecutor

            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="session-memory")
        return self._executor


def checked(settings) -> dict[str, Any]:
    """``[plugins.session_memory]`` with the defaults filled in; ValueError naming a bad key."""
    values = settings.plugin_settings("session_memory", _DEFAULTS)
    if not isinstance(values["enabled"], bool):
        raise ValueError("[plugins.session_memory] enabled must be true or false")
    for key, low in (("ttl_s", 1e-3), ("recent_share", 0.0), ("min_score", -1.0)):
        v = values[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not low <= v < float("inf"):
            raise ValueError(f"[plugins.session_memory] {key} must be a number >= {low}")
    if values["recent_share"] > 1:
        raise ValueError("[plugins.session_memory] recent_share must be between 0 and 1")
    for key, low in (
        ("max_session_kb", 1),
        ("max_total_mb", 1),
        ("max_sessions", 1),
        ("token_budget", 0),
        ("reserve_tokens", 1),
        ("chunk_chars", 16),
        ("max_recalled", 1),
    ):
        v = values[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"[plugins.session_memory] {key} must be an integer >= {low}")
    if values["embedder"] not in ("auto", "minilm", "lexical"):
        raise ValueError("[plugins.session_memory] embedder must be auto, minilm or lexical")
    return values


def register_tunables(register) -> None:
    register(
        Tunable(
            "session_memory.ttl_s",
            "float",
            3600.0,
            "Session memory: seconds an entry lives after last seen.",
            live=True,
            minimum=1.0,
            maximum=30 * 86400.0,
            searchable=False,
        )
    )
    register(
        Tunable(
            "session_memory.max_session_kb",
            "int",
            1024,
            "Session memory: byte budget per session, KiB.",
            live=True,
            minimum=1,
            maximum=1 << 20,
            searchable=False,
        )
    )
    register(
        Tunable(
            "session_memory.token_budget",
            "int",
            0,
            "Session memory: prompt token budget (0 = the model's context).",
            live=True,
            minimum=0,
            maximum=1 << 22,
            searchable=False,
        )
    )


def _turns(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m["role"], text) for m in messages if m.get("role") in ("user", "assistant") and (text := message_text(m))]
