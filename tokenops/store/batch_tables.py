"""SQLModel classes of the Batch API's tables (``files``, ``batches``; migrations 11 and 12): the
metadata of uploaded and written JSONL files and the state of each batch. File bytes live on
disk beside the store file (:mod:`tokenops.store.batch_store`). Timestamps are naive UTC, as
everywhere in the store; the API shows them as unix seconds."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel


def _col(sa_type: Any, *, primary_key: bool = False, nullable: bool = True, is_json: bool = False) -> Any:
    kwargs = {"info": {"json": True}} if is_json else {}
    return Field(default=None, primary_key=primary_key, sa_type=sa_type, nullable=nullable, sa_column_kwargs=kwargs)


STR, INT, BIGINT, DOUBLE, TS = sa.String, sa.Integer, sa.BigInteger, sa.Double, sa.DateTime


class FileRow(SQLModel, table=True):
    """An uploaded file (``purpose = "batch"``) or one a batch wrote (``batch_output``)."""

    __tablename__ = "files"

    id: str = _col(STR, primary_key=True, nullable=False)
    tenant: str = _col(STR, nullable=False)
    purpose: str = _col(STR, nullable=False)
    filename: str | None = _col(STR)
    num_bytes: int | None = _col(BIGINT)
    num_lines: int | None = _col(INT)
    created_at: datetime = _col(TS, nullable=False)
    batch_id: str | None = _col(STR)  # the batch that wrote it (outputs and errors)
    #: past it the file reads as missing, and the gateway's sweep deletes it (migration 12)
    expires_at: datetime | None = _col(TS)


class BatchRow(SQLModel, table=True):
    """One batch: its input, its state and counts, and when it passed each state. The output
    and error file ids are chosen at creation (the runner appends to those files); they become
    files (and visible on the batch) when it finishes."""

    __tablename__ = "batches"

    id: str = _col(STR, primary_key=True, nullable=False)
    tenant: str = _col(STR, nullable=False)
    api_key_id: str | None = _col(STR)
    endpoint: str = _col(STR, nullable=False)
    input_file_id: str = _col(STR, nullable=False)
    completion_window: str | None = _col(STR)
    window_s: float | None = _col(DOUBLE)
    status: str = _col(STR, nullable=False)
    output_file_id: str | None = _col(STR)
    error_file_id: str | None = _col(STR)
    metadata_json: str | None = _col(STR, is_json=True)
    errors_json: str | None = _col(STR, is_json=True)
    num_total: int | None = _col(INT)
    num_completed: int | None = _col(INT)
    num_failed: int | None = _col(INT)
    created_at: datetime = _col(TS, nullable=False)
    in_progress_at: datetime | None = _col(TS)
    expires_at: datetime | None = _col(TS)
    finalizing_at: datetime | None = _col(TS)
    completed_at: datetime | None = _col(TS)
    failed_at: datetime | None = _col(TS)
    expired_at: datetime | None = _col(TS)
    cancelling_at: datetime | None = _col(TS)
    cancelled_at: datetime | None = _col(TS)
    #: ``output_expires_after.seconds``: the output and error files expire this long after they are
    #: recorded (migration 12)
    output_expires_s: int | None = _col(INT)
