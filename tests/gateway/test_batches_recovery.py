"""What a restarted runner knows is done: the output and error files, read back. A line a crash
tore (no newline yet) is cut off and not counted done; lines that never ran (expired) are not
counted as failed. In-process, no server: the serve test kills a real one (slow)."""

from __future__ import annotations

import asyncio
import json

from tokenops.gateway.batches.batch_output import DurableAppender, output_line, recover


def test_a_torn_last_line_is_cut_off_and_not_counted_done(tmp_path):
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    whole = output_line("a", 200, "req-1", {"ok": True}, None) + output_line("b", 200, "req-2", {"ok": True}, None)
    out.write_bytes(whole + output_line("c", 200, "req-3", {"ok": True}, None)[:25])  # killed mid-write
    err.write_bytes(
        output_line("d", 400, "req-4", {"error": {}}, {"code": "invalid_value", "message": "x"})
        + output_line("e", 0, None, None, {"code": "batch_expired", "message": "late"})
    )
    found = recover(out, err)
    assert found.done == {"a", "b", "d", "e"} and (found.num_completed, found.num_failed) == (2, 1)
    assert out.read_bytes() == whole  # the torn line is gone: "c" runs again and appears once

    async def append() -> None:
        appender = DurableAppender(out, err)
        await appender.append(False, output_line("c", 200, "req-5", {"ok": True}, None))
        appender.close()

    asyncio.run(append())
    again = recover(out, err)
    assert again.done == {"a", "b", "c", "d", "e"} and again.num_completed == 3
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["custom_id"] for line in lines] == ["a", "b", "c"]
    assert lines[2]["response"] == {"status_code": 200, "request_id": "req-5", "body": {"ok": True}}
    assert lines[2]["error"] is None and lines[2]["id"].startswith("batch_req_")


def test_a_line_cancelled_while_being_written_is_written_whole_before_the_files_are_read(tmp_path):
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"

    async def cancel_mid_write() -> None:
        appender = DurableAppender(out, err)
        writes = [
            asyncio.ensure_future(appender.append(False, output_line(f"x{i}", 200, None, {}, None))) for i in range(20)
        ]
        await asyncio.sleep(0)  # the writes have started
        for write in writes:
            write.cancel()  # an expiry or a cancel of the batch while its lines are written
        await appender.drain()
        appender.close()
        # what the runner reads back at finalizing holds every line whose write began, once
        assert recover(out, err).done == {f"x{i}" for i in range(20)}

    asyncio.run(cancel_mid_write())
    assert len(out.read_text().splitlines()) == 20
