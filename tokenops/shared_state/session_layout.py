"""How a session of :mod:`tokenops.shared_state.redis_memory` is laid out in Redis: its names,
its value (entries as JSON, a NUL, then their float32 vectors) and the bookkeeping script its
writes run."""

from __future__ import annotations

import json

import numpy as np

from tokenops.memory.memory_store import MemoryEntry

#: The bookkeeping of one write of a session, run inside the write's MULTI after the session's own
#: ``SET`` (or ``DEL``): keep the per-session byte hash and the total in step, count merges and
#: evictions, drop expired sessions, then least recently used ones while over either budget. The
#: session's value never passes through the script (a 64 KB string handed to Lua and back costs
#: Redis ~0.3 ms; a plain SET of it ~0.01 ms). A session it drops goes with its version key and is
#: announced on the copies' channel (:mod:`tokenops.shared_state.session_copies`). A stored session
#: gets a new version from one counter of all sessions (never reused, so a session dropped and
#: made again is not taken for the old one); the script returns it (0 when deleted). KEYS: lru,
#: sizes, total, stats, the version counter, the session's version key. ARGV: member, size, now,
#: expire before, max total bytes, max sessions, the session keys' prefix, merged, expired,
#: evicted, the channel, the version keys' prefix, the session's lifetime in ms.
_BOOKKEEP = """
local member, size, now = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local old = tonumber(redis.call('HGET', KEYS[2], member) or '0')
if size > 0 then
  redis.call('HSET', KEYS[2], member, size)
  redis.call('ZADD', KEYS[1], now, member)
else
  redis.call('HDEL', KEYS[2], member)
  redis.call('ZREM', KEYS[1], member)
end
redis.call('INCRBY', KEYS[3], size - old)
local version = 0
if size > 0 then
  version = redis.call('INCR', KEYS[5])
  redis.call('SET', KEYS[6], version, 'PX', ARGV[13])
end
for i, name in ipairs({'merged', 'expired', 'evicted'}) do
  if tonumber(ARGV[7 + i]) > 0 then redis.call('HINCRBY', KEYS[4], name, ARGV[7 + i]) end
end
local function drop(m)
  local s = tonumber(redis.call('HGET', KEYS[2], m) or '0')
  redis.call('DEL', ARGV[7] .. m, ARGV[12] .. m)
  redis.call('PUBLISH', ARGV[11], '-:' .. m)
  redis.call('HDEL', KEYS[2], m)
  redis.call('ZREM', KEYS[1], m)
  redis.call('INCRBY', KEYS[3], -s)
end
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[4])) do
  drop(m)
end
local evicted = 0
while redis.call('ZCARD', KEYS[1]) > 1 and (tonumber(redis.call('GET', KEYS[3]) or '0') > tonumber(ARGV[5])
    or redis.call('ZCARD', KEYS[1]) > tonumber(ARGV[6])) do
  drop(redis.call('ZRANGE', KEYS[1], 0, 0)[1])
  evicted = evicted + 1
end
return version
"""


def _member(tenant: str, session: str) -> str:
    return f"{tenant.encode().hex()}:{session.encode().hex()}"


def _names(member: str) -> tuple[str, str]:
    tenant, session = member.split(":")
    return bytes.fromhex(tenant).decode(), bytes.fromhex(session).decode()


def encode_entries(entries: list[MemoryEntry]) -> bytes:
    """A session's stored value."""
    meta = [[e.id, e.role, e.text, e.created_at, e.last_seen, e.num_seen] for e in entries]
    vectors = b"".join(np.asarray(e.vector, dtype=np.float32).tobytes() for e in entries)
    return json.dumps(meta, separators=(",", ":")).encode() + b"\x00" + vectors


def decode_entries(blob: bytes | None) -> list[MemoryEntry]:
    """The entries of a value as :func:`encode_entries` made it."""
    if not blob:
        return []
    meta_bytes, _, vector_bytes = blob.partition(b"\x00")
    meta = json.loads(meta_bytes)
    if not meta:
        return []
    vectors = np.frombuffer(vector_bytes, dtype=np.float32).reshape(len(meta), -1)
    return [
        MemoryEntry(int(i), role, text, vectors[n].copy(), created, seen, int(num))
        for n, (i, role, text, created, seen, num) in enumerate(meta)
    ]
