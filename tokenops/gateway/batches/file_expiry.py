"""Files that expire (OpenAI's ``expires_after`` on ``POST /v1/files`` and
``output_expires_after`` on ``POST /v1/batches``): the two checked the same way, and the sweep
that deletes expired files.

A file with an ``expires_at`` reads as missing from that second on (the store's reads leave it
out: a 404 on ``GET /v1/files/{id}`` and its content, absent from the list), and the sweep, run
from the batch runner's loop every :data:`SWEEP_EVERY_S`, deletes its row and bytes as
``DELETE /v1/files/{id}`` does. A file that is the input of a batch that has not finished is
kept (the runner reads it) and swept once that batch finishes. Where replicas share the state,
each one sweeps; deleting a file twice is harmless.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tokenops.gateway.errors import APIError
from tokenops.store.migrations import utcnow

log = logging.getLogger("tokenops.batches")

#: OpenAI's bounds of ``expires_after.seconds``: one hour to 30 days
MIN_EXPIRES_S, MAX_EXPIRES_S = 3600, 30 * 24 * 3600
#: the sweep runs at most this often (reads are exact to the second in between)
SWEEP_EVERY_S = 10.0
#: the multipart fields of ``expires_after`` (the openai SDK's encoding of the nested object)
ANCHOR_FIELD, SECONDS_FIELD = "expires_after[anchor]", "expires_after[seconds]"


class ExpiresAfter(BaseModel):
    """``output_expires_after`` of ``POST /v1/batches`` (and ``expires_after`` of an upload)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    anchor: Literal["created_at"]
    seconds: int = Field(ge=MIN_EXPIRES_S, le=MAX_EXPIRES_S)


def upload_expiry(form: Any) -> int | None:
    """The seconds of an upload's ``expires_after[anchor]`` / ``expires_after[seconds]`` form
    fields (both or neither), or the 400 naming the field at fault."""
    anchor, seconds = form.get(ANCHOR_FIELD), form.get(SECONDS_FIELD)
    if anchor is None and seconds is None:
        return None
    if anchor is None or seconds is None:
        missing, given = (ANCHOR_FIELD, SECONDS_FIELD) if anchor is None else (SECONDS_FIELD, ANCHOR_FIELD)
        raise APIError(
            400, f"{missing}: required with {given} (send both, or neither)", code="invalid_value", param=missing
        )
    if anchor != "created_at":
        raise APIError(
            400, f'{ANCHOR_FIELD}: only "created_at" is supported, got {anchor!r}', code="invalid_value",
            param=ANCHOR_FIELD,
        )  # fmt: skip
    text = seconds if isinstance(seconds, str) else ""
    value = int(text) if text.isascii() and text.isdigit() and len(text) <= 12 else None
    if value is None or not MIN_EXPIRES_S <= value <= MAX_EXPIRES_S:
        raise APIError(
            400,
            f"{SECONDS_FIELD}: an integer number of seconds from {MIN_EXPIRES_S} (1 hour) to {MAX_EXPIRES_S} "
            f"(30 days), got {seconds if isinstance(seconds, str) else 'a file'!r}",
            code="invalid_value",
            param=SECONDS_FIELD,
        )
    return value


def sweep(store: Any, now: datetime | None = None) -> list[str]:
    """(blocking) Delete every file expired at ``now`` (naive UTC; default: now), row and bytes,
    except the inputs of batches that have not finished; returns the ids deleted."""
    expired = store.expired_files(now or utcnow())
    if not expired:
        return []
    in_use = {b["input_file_id"] for b in store.active_batches()}
    deleted = []
    for tenant, file_id in expired:
        if file_id not in in_use and store.delete_file(tenant, file_id):
            deleted.append(file_id)
    return deleted


class FileSweeper:
    """Runs :func:`sweep` from the batch runner's loop, at most every ``every_s`` seconds."""

    def __init__(self, store: Any, every_s: float = SWEEP_EVERY_S) -> None:
        self.store = store
        self.every_s = every_s
        self.num_deleted = 0
        self._next_at = 0.0

    async def maybe_sweep(self) -> None:
        now = time.monotonic()
        if now < self._next_at:
            return
        self._next_at = now + self.every_s
        try:
            deleted = await asyncio.to_thread(sweep, self.store)
        except Exception:
            log.exception("file expiry: the sweep failed (tried again in %.0f s)", self.every_s)
            return
        if deleted:
            self.num_deleted += len(deleted)
            log.info("file expiry: deleted %d expired file(s)", len(deleted))
