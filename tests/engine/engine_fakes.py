"""Fakes for testing the engine core without a model: a byte tokenizer and a runner
whose "KV cache" stores token ids, so a wrong block table or a missed copy changes
the output (or trips an assert) exactly as corrupt K/V would."""

from __future__ import annotations

import time
import zlib
from typing import Callable

import torch

BOS, EOS, OFFSET = 0, 1, 2


class FakeTokenizer:
    """Byte-level: token ``b + 2`` is byte ``b``; 0 is BOS, 1 is EOS."""

    eos_token_ids = {EOS}
    bos_token_id = BOS
    vocab_size = 256 + OFFSET

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([BOS] if add_special_tokens else []) + [b + OFFSET for b in text.encode()]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(i - OFFSET for i in ids if i >= OFFSET).decode("utf-8", errors="replace")

    def id_to_token(self, i: int) -> str:
        return {BOS: "<s>", EOS: "</s>"}.get(i) or bytes([i - OFFSET]).decode("latin-1")


class FakeDetokenizer:
    """Emits text once it decodes cleanly (never half a UTF-8 character)."""

    def __init__(self, tokenizer: FakeTokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer, self.ids, self.text = tokenizer, [], ""

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):
            return ""
        new, self.text = text[len(self.text):], text
        return new


def default_next_token(context: list[int]) -> int:
    """A deterministic "model": the next token depends on the whole context; avoids EOS."""
    return zlib.crc32(bytes(str(context), "ascii")) % 90 + OFFSET + 32


class FakeRunner:
    """Implements the ModelRunner interface over a token-id "KV cache"."""

    is_moe = False
    device = "cpu"
    hf_config = None

    def __init__(self, num_blocks: int = 64, block_size: int = 4, max_model_len: int = 256,
                 next_token: Callable[[list[int]], int] = default_next_token) -> None:
        self.tokenizer = FakeTokenizer()
        self.model_name = "fake"
        self.num_blocks, self.block_size, self.max_model_len = num_blocks, block_size, max_model_len
        self.vocab_size = FakeTokenizer.vocab_size
        self.next_token = next_token
        self.cache: list[list[int | None]] = [[None] * block_size for _ in range(num_blocks)]
        self.num_forward_calls = 0
        self.num_computed_tokens = 0
        self.fail_on_token: int | None = None
        self.chunk_sizes: list[list[int]] = []
        self.step_delay_s = 0.0  # makes streams slow enough to cancel mid-way

    def _slot(self, block_table: list[int], pos: int) -> tuple[int, int]:
        return block_table[pos // self.block_size], pos % self.block_size

    def execute(self, chunks) -> torch.Tensor:
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        self.num_forward_calls += 1
        self.chunk_sizes.append([len(c.token_ids) for c in chunks])
        rows = []
        for c in chunks:
            if self.fail_on_token is not None and self.fail_on_token in c.token_ids:
                raise RuntimeError("injected failure")
            assert len(c.block_table) * self.block_size >= c.start_pos + len(c.token_ids)
            for i, t in enumerate(c.token_ids):
                b, s = self._slot(c.block_table, c.start_pos + i)
                self.cache[b][s] = t
            self.num_computed_tokens += len(c.token_ids)
            context = []
            for pos in range(c.start_pos + len(c.token_ids)):
                b, s = self._slot(c.block_table, pos)
                assert self.cache[b][s] is not None, f"position {pos} read before it was written"
                context.append(self.cache[b][s])
            gen = torch.Generator().manual_seed(zlib.crc32(bytes(str(context), "ascii")))
            logits = torch.randn(self.vocab_size, generator=gen)
            logits[self.next_token(context)] += 8.0
            rows.append(logits)
        return torch.stack(rows)

    def copy_block(self, src: int, dst: int) -> None:
        self.cache[dst] = list(self.cache[src])

    def expert_load(self):
        return None


def reference_greedy(prompt: list[int], max_tokens: int,
                     next_token: Callable[[list[int]], int] = default_next_token) -> list[int]:
    """What greedy decoding must produce, computed without the engine."""
    context, out = list(prompt), []
    for _ in range(max_tokens):
        t = next_token(context)
        out.append(t)
        context.append(t)
    return out
