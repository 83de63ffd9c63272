"""``tokenops serve``'s start-up display (tokenops/cli/serve_progress.py): one plain line per step
when stderr is not a terminal, a rich progress display when it is; a kernel compile is shown
as a step of its own, saying that it happens once and where it is cached."""

from __future__ import annotations

import io
from pathlib import Path

from tokenops.cli.serve_progress import StartProgress
from tokenops.engine.kernels import compile_notice


def _start(progress: StartProgress, cache: Path) -> None:
    progress.loading("demo", "bundled engine, /models/demo.gguf")
    progress.loading("bad", "bundled engine, /models/bad")
    progress.on_demand("emb", "embedding")
    with compile_notice.compiling("quant", cache):
        pass
    progress.failed("bad", 0.25)
    progress.loaded("demo", 1.5)
    progress.ready(["demo", "emb"])


def test_plain_lines_in_order_when_not_a_terminal(tmp_path):
    out = io.StringIO()
    progress = StartProgress(out, is_tty=False)
    try:
        _start(progress, tmp_path)
        with compile_notice.compiling("fused_decode_gguf", tmp_path):  # after ready: still said
            pass
    finally:
        progress.detach()
    lines = out.getvalue().splitlines()
    assert lines[:5] == [
        "loading demo (bundled engine, /models/demo.gguf)…",
        "loading bad (bundled engine, /models/bad)…",
        "emb (embedding): loads on its first request",
        f"compiling the quantized kernels for this CPU (once; cached in {tmp_path})…",
        lines[4],
    ]
    assert lines[4].startswith("compiled the quantized kernels in ")
    assert lines[5:7] == ["bad failed after 0.2 s", "loaded demo in 1.5 s"]
    assert lines[7].startswith("ready: demo, emb (")
    assert lines[8].startswith("compiling the fused decode-step kernels (fused_decode_gguf) for this CPU (once;")
    assert len(lines) == 10
    with compile_notice.compiling("quant", tmp_path):  # detached: no longer told
        pass
    assert len(out.getvalue().splitlines()) == 10


def test_a_terminal_gets_the_progress_display(tmp_path):
    out = io.StringIO()
    progress = StartProgress(out, is_tty=True)
    try:
        _start(progress, tmp_path)
    finally:
        progress.detach()
    text = out.getvalue()
    for shown in ("✓ loaded demo in 1.5 s", "✗ bad failed after 0.2 s", "✓ compiled the quantized kernels in ",
                  "emb (embedding): loads on its first request", "ready: demo, emb ("):
        assert shown in text, text
    assert text.index("✓ loaded demo") < text.index("ready: demo, emb")
