"""Our models against Hugging Face transformers on tiny random checkpoints:
prefill logits, chunked prefill + paged decode greedy tokens, and batching invariance."""

from __future__ import annotations

import pytest
import torch

from tiny_models import ARCHS, load_hf_model
from tokenops.engine.core.batch import ChunkInput

BLOCK = 4
PROMPT_LEN = 13
NUM_NEW = 10


def prompt(seed: int, n: int = PROMPT_LEN) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 300, (n,), generator=g).tolist()


def scattered_blocks(num: int, offset: int) -> list[int]:
    """Non-contiguous, out-of-order physical blocks (the runner must follow the table)."""
    return [(offset + 7 * i) % 64 for i in range(num)][::-1]


def greedy_paged(runner, ids: list[int], num_new: int, splits: list[int], table: list[int]) -> tuple[list[int], list]:
    """Chunked prefill at ``splits`` then ``num_new`` decodes; returns tokens and the logits seen."""
    bounds = [0, *splits, len(ids)]
    logits_seen = []
    for a, b in zip(bounds, bounds[1:]):
        logits = runner.execute([ChunkInput(ids[a:b], a, table)])
        logits_seen.append(logits[0])
    out: list[int] = []
    seq = list(ids)
    for _ in range(num_new):
        token = int(logits_seen[-1].argmax())
        out.append(token)
        seq.append(token)
        logits_seen.append(runner.execute([ChunkInput([token], len(seq) - 1, table)])[0])
    return out, logits_seen


def hf_greedy(hf, ids: list[int], num_new: int) -> list[int]:
    hf.generation_config.eos_token_id = None
    out = hf.generate(
        torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        do_sample=False, max_new_tokens=num_new, min_new_tokens=num_new, pad_token_id=0,
    )  # fmt: skip
    return out[0, len(ids) :].tolist()


@pytest.fixture(scope="module", params=ARCHS)
def pair(request, tiny_checkpoint):
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.model_runner import ModelRunner

    path = tiny_checkpoint(request.param)
    runner = ModelRunner(EngineConfig(model=str(path), device="cpu", block_size=BLOCK, kv_cache_tokens=64 * BLOCK))
    return request.param, runner, load_hf_model(path)


@torch.no_grad()
def test_prefill_logits_match_hf(pair):
    arch, runner, hf = pair
    ids = prompt(1)
    ref = hf(torch.tensor([ids])).logits[0]
    ours = runner.execute([ChunkInput(ids, 0, scattered_blocks(4, 1))])
    assert ours.shape == (1, runner.vocab_size) and ours.dtype == torch.float32
    torch.testing.assert_close(ours[0], ref[-1], atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_chunked_prefill_and_decode_match_hf_generate(pair):
    arch, runner, hf = pair
    ids = prompt(2)
    table = scattered_blocks(8, 3)  # 32 slots for 13 + 10 tokens
    tokens, seen = greedy_paged(runner, ids, NUM_NEW, splits=[5, 9], table=table)
    assert tokens == hf_greedy(hf, ids, NUM_NEW), arch
    # Every logit row we produced matches HF's full forward at that position.
    full = hf(torch.tensor([ids + tokens])).logits[0]
    positions = [4, 8, 12] + [PROMPT_LEN + i for i in range(NUM_NEW)]
    for row, pos in zip(seen, positions):
        torch.testing.assert_close(row, full[pos], atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_batched_step_equals_each_sequence_alone(pair):
    """A step mixing a decode, a fresh prefill and a continued prefill chunk gives
    each sequence the logits it gets when run alone."""
    arch, runner, hf = pair
    a, b, c = prompt(3, 11), prompt(4, 9), prompt(5, 12)
    ta, tb, tc = scattered_blocks(4, 0), scattered_blocks(4, 1), scattered_blocks(4, 2)
    # Alone: a fully prefilled, b in one go, c in two chunks.
    alone_a = runner.execute([ChunkInput(a, 0, ta)])[0]
    next_a = int(alone_a.argmax())
    alone_a2 = runner.execute([ChunkInput([next_a], len(a), ta)])[0]
    alone_b = runner.execute([ChunkInput(b, 0, tb)])[0]
    runner.execute([ChunkInput(c[:6], 0, tc)])
    alone_c = runner.execute([ChunkInput(c[6:], 6, tc)])[0]
    # Together (prefill chunks listed before the decode on purpose: the runner reorders).
    runner.execute([ChunkInput(a, 0, ta), ChunkInput(c[:6], 0, tc)])
    both = runner.execute([ChunkInput(b, 0, tb), ChunkInput(c[6:], 6, tc), ChunkInput([next_a], len(a), ta)])
    torch.testing.assert_close(both[0], alone_b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(both[1], alone_c, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(both[2], alone_a2, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_many_decodes_batched_match_hf(pair):
    """Several decodes of different lengths in one step (padded batch) match HF."""
    arch, runner, hf = pair
    prompts = [prompt(10 + i, n) for i, n in enumerate((3, 8, 14, 6))]
    tables = [scattered_blocks(6, i) for i in range(len(prompts))]
    seqs = [list(p) for p in prompts]
    last = runner.execute([ChunkInput(p, 0, t) for p, t in zip(prompts, tables)])
    for _ in range(5):
        for s, row in zip(seqs, last):
            s.append(int(row.argmax()))
        last = runner.execute([ChunkInput([s[-1]], len(s) - 1, t) for s, t in zip(seqs, tables)])
    for p, s, row in zip(prompts, seqs, last):
        full = hf(torch.tensor([s])).logits[0]
        # Greedy: each generated token is HF's argmax at the position before it.
        assert s[len(p) :] == full[len(p) - 1 : -1].argmax(-1).tolist()
        torch.testing.assert_close(row, full[-1], atol=1e-4, rtol=1e-4)
