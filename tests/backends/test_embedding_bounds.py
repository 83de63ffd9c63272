"""Embedding inputs refused before tokenizing, and counted without Python id lists (issue 42)."""

from __future__ import annotations

import time

import pytest

from tokenops.backends.embedding import _count_tokens, _load, is_default_available
from tokenops.types import BackendError

pytestmark = pytest.mark.skipif(not is_default_available(), reason="needs the semantic extra (MiniLM)")


@pytest.fixture(scope="module")
def minilm():
    return _load(None, "cpu")


def test_counts_match_the_tokenizer_and_a_long_input_is_named(minilm):
    texts = ["hello world", "lorem ipsum " * 20]
    expected = [len(ids) for ids in minilm.tokenizer(texts, add_special_tokens=True)["input_ids"]]
    assert _count_tokens(minilm.tokenizer, texts, 256, False) == expected
    minilm.tokenizer(["x " * 600], truncation=True, max_length=256)  # leaves truncation set on the shared one
    with pytest.raises(BackendError) as e:
        _count_tokens(minilm.tokenizer, ["short", "lorem ipsum " * 200], 256, False)
    assert "input[1]" in str(e.value) and e.value.status == 400  # counted untruncated all the same


def test_a_huge_input_is_refused_before_tokenizing(minilm):
    from tokenops.backends.embedding import EmbeddingBackend

    backend = EmbeddingBackend.__new__(EmbeddingBackend)
    backend.max_model_len = 256
    text = "word " * 780_000  # 3.9 MB
    t0 = time.perf_counter()
    with pytest.raises(BackendError, match="maximum context length"):
        backend._check_lengths(minilm, [text], True)
    took = time.perf_counter() - t0
    t0 = time.perf_counter()
    minilm.tokenizer.backend_tokenizer.encode(text[: len(text) // 20])  # a twentieth of the tokenizing spared
    assert took < time.perf_counter() - t0
