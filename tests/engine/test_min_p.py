"""``min_p`` (llama.cpp's and vLLM's) in the sampler, and the top-k path that selects the k best
columns instead of sorting the vocabulary: the same distribution as the full sort."""

from __future__ import annotations

import math

import pytest
import torch

from tokenops.engine.sampling.sampling import Sampler, SamplingParams


def test_min_p_drops_tokens_under_a_share_of_the_likeliest():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.12, 0.05, 0.03]]))
    probs = Sampler(0).probs(logits, [SamplingParams(temperature=1.0, min_p=0.15)])[0]
    assert probs[3] == 0 and probs[4] == 0 and probs[2] > 0  # 0.05 and 0.03 are under 0.15 x 0.5
    assert math.isclose(probs.sum().item(), 1.0, rel_tol=1e-6)
    assert torch.equal(Sampler(0).probs(logits, [SamplingParams(temperature=1.0, min_p=0.0)])[0] > 0,
                       torch.ones(5, dtype=torch.bool))


@pytest.mark.parametrize("top_p,min_p", [(1.0, 0.0), (0.9, 0.0), (0.95, 0.05), (1.0, 0.2)])
def test_the_top_k_selection_matches_the_full_sort(top_p, min_p):
    torch.manual_seed(0)
    logits = torch.randn(6, 3000) * 3
    params = [SamplingParams(temperature=0.8, top_k=40, top_p=top_p, min_p=min_p)] * 5
    params.append(SamplingParams(temperature=0.8, top_k=7, top_p=top_p, min_p=min_p))
    fast = Sampler(0).probs(logits, params)
    # the same rows with one row untruncated take the full-sort path; compare the truncated rows
    slow = Sampler(0).probs(torch.cat([logits, logits[:1]]), [*params, SamplingParams(temperature=0.8)])[:6]
    torch.testing.assert_close(fast, slow)
    assert ((fast > 0).sum(-1) <= torch.tensor([40] * 5 + [7])).all()


def test_min_p_must_be_in_range():
    with pytest.raises(ValueError, match="min_p"):
        SamplingParams(min_p=1.0)
