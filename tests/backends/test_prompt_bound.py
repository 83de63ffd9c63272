"""Issue 17 defect 1: a prompt that cannot fit is refused before tokenization, in microseconds,
and long texts are tokenized through the GIL-free call with the same ids."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tokenops.backends.prompt_bound import check_prompt_fits, max_token_chars
from tokenops.types import BackendError, GatewayRequest

DEMO = Path(__file__).resolve().parents[2] / "tokenops" / "demo_models" / "target"


@pytest.fixture(scope="module")
def tokenizer():
    from tokenops.engine.core.tokenizer import Tokenizer

    return Tokenizer.from_dir(DEMO)


def _chat(*contents) -> GatewayRequest:
    return GatewayRequest(kind="chat", model="m", body={}, messages=[{"role": "user", "content": c} for c in contents],
                          max_tokens=4)


def test_a_prompt_that_cannot_fit_is_refused_without_tokenizing(tokenizer):
    longest = max_token_chars(tokenizer)
    assert 1 < longest < 200
    prompt = "lorem ipsum " * 325_000
    t0 = time.perf_counter()
    with pytest.raises(BackendError) as e:
        check_prompt_fits(_chat(prompt), tokenizer, 2048, "m#0")
    took = time.perf_counter() - t0
    t0 = time.perf_counter()
    tokenizer.encode(prompt[: len(prompt) // 10])  # a tenth of the tokenizing the check spares
    assert took < time.perf_counter() - t0
    assert e.value.kind == "context_length" and e.value.status == 400 and "2048" in str(e.value)
    parts = GatewayRequest(kind="chat", model="m", body={}, max_tokens=4,
                           messages=[{"role": "user", "content": [{"type": "text", "text": "x" * 4_000_000}]}])
    with pytest.raises(BackendError):
        check_prompt_fits(parts, tokenizer, 2048, "m#0")


def test_prompts_that_might_fit_are_left_to_the_tokenizer(tokenizer):
    bound = 2048 * max_token_chars(tokenizer) * 4
    check_prompt_fits(_chat("a" * (bound - 10)), tokenizer, 2048, "m#0")  # may fit: tokenization decides
    check_prompt_fits(_chat("short"), tokenizer, 2048, "m#0")
    check_prompt_fits(_chat("x" * 10_000_000), tokenizer, None, "m#0")  # no limit known: nothing to check


def test_long_texts_encode_the_same_and_leave_the_gil_free(tokenizer):
    text = "The quick brown fox, jumping over 13 lazy dogs! " * 3000
    assert tokenizer.encode(text, add_special_tokens=False) == tokenizer.backend.encode(text, add_special_tokens=False).ids
    assert tokenizer.encode(text) == tokenizer.encode(text[:1000] + text[1000:])
    done, gaps, took = threading.Event(), [], []

    def work():
        t0 = time.perf_counter()
        tokenizer.encode(text * 4, add_special_tokens=False)
        took.append(time.perf_counter() - t0)
        done.set()

    threading.Thread(target=work).start()
    last = time.perf_counter()
    while not done.is_set():
        time.sleep(0.001)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    # the single-text call held the GIL for its whole run: this thread then stalled as long
    assert max(gaps) < 0.5 * took[0], (max(gaps), took[0])
