"""SamplingParams validation and the Sampler's greedy, top-k, top-p, seeds and logprobs."""

import pytest
import torch

from tokenops.engine.sampling.sampling import Sampler, SamplingParams
from tokenops.engine.core.sequence import Sequence


def seqs_for(*params):
    out = []
    for p in params:
        s = Sequence("r", [1], p)
        if p.seed is not None:
            s.generator = Sampler.new_generator(p.seed, 0)
        out.append(s)
    return out


@pytest.mark.parametrize("kwargs,match", [
    ({"n": 0}, "n must"), ({"max_tokens": 0}, "max_tokens"), ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"top_k": -2}, "top_k"), ({"logprobs": 21}, "logprobs"),
    ({"stop": [""]}, "stop"), ({"stop_token_ids": [-1]}, "stop_token_ids"), ({"seed": 1.5}, "seed"),
])
def test_invalid_params_are_rejected_with_a_clear_message(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_params_normalise_friendly_spellings():
    p = SamplingParams(stop="END", top_k=-1)
    assert p.stop == ["END"] and p.top_k == 0 and not p.is_greedy
    assert SamplingParams(temperature=0).is_greedy and SamplingParams(top_k=1).is_greedy


def test_greedy_takes_the_argmax():
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, 0.0, 1.0]])
    out = Sampler().sample(logits, seqs_for(SamplingParams(temperature=0), SamplingParams(temperature=0)))
    assert [t.token_id for t in out] == [1, 0]


def test_top_k_and_top_p_restrict_the_candidates():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(400, 1)
    sampler = Sampler(seed=3)
    top_k = sampler.sample(logits, seqs_for(*[SamplingParams(top_k=2)] * 400))
    assert {t.token_id for t in top_k} == {0, 1}
    top_p = sampler.sample(logits, seqs_for(*[SamplingParams(top_p=0.85)] * 400))
    assert {t.token_id for t in top_p} == {0, 1, 2}
    low_temp = sampler.sample(logits, seqs_for(*[SamplingParams(temperature=0.05)] * 400))
    assert sum(t.token_id == 0 for t in low_temp) > 390


def test_seeded_rows_ignore_their_batch_neighbours():
    torch.manual_seed(0)
    row = torch.randn(1, 50)
    others = torch.randn(5, 50)
    p = SamplingParams(seed=42)
    alone = [Sampler(seed=1).sample(row, seqs_for(p))[0].token_id for _ in range(1)]
    s = seqs_for(p)[0]
    tokens_alone = [Sampler(seed=1).sample(row, [s])[0].token_id for _ in range(10)]
    s2 = seqs_for(p)[0]
    batch = torch.cat([others, row])
    tokens_batched = [Sampler(seed=2).sample(batch, seqs_for(*[SamplingParams()] * 5) + [s2])[5].token_id
                      for _ in range(10)]
    assert tokens_alone == tokens_batched and tokens_alone[0] == alone[0]
    assert len(set(tokens_alone)) > 1  # the generator advances


def test_logprobs_are_raw_log_softmax_with_top_alternatives():
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.5]])
    out = Sampler().sample(logits, seqs_for(SamplingParams(temperature=0.1, logprobs=2)))[0]
    expected = torch.log_softmax(logits[0], -1)  # not of the temperature-scaled logits
    assert out.logprob == pytest.approx(expected[out.token_id].item())
    assert [t for t, _ in out.top] == [2, 1]
    assert out.top[0][1] == pytest.approx(expected[2].item())


def test_draw_inverts_the_cdf_exactly():
    import torch

    from tokenops.engine.sampling.sampling import draw

    probs = torch.tensor([[0.1, 0.0, 0.2, 0.7], [0.0, 0.0, 1.0, 0.0]])
    # boundaries: u * total falls in [cdf[i-1], cdf[i]) -> token i; zero-weight tokens are never picked
    u = torch.tensor([0.0, 0.0999, 0.1001, 0.2999, 0.3001, 0.9999999], dtype=torch.float64)
    assert draw(probs[:1].expand(6, 4), u).tolist() == [0, 0, 2, 2, 3, 3]
    assert draw(probs[1:].expand(3, 4), torch.tensor([0.0, 0.5, 0.9999999])).tolist() == [2, 2, 2]
    # unnormalised weights are fine
    assert draw(torch.tensor([[2.0, 6.0]]), torch.tensor([0.3])).tolist() == [1]
    # the frequencies match the distribution
    g = torch.Generator().manual_seed(0)
    n = 200_000
    picks = draw(probs[:1].expand(n, 4), torch.rand(n, generator=g, dtype=torch.float64))
    freq = torch.bincount(picks, minlength=4).double() / n
    assert torch.allclose(freq, probs[0].double(), atol=0.005) and freq[1] == 0
    # a kept buffer gives the same draws
    buf = torch.empty(n, 4, dtype=torch.float64)
    u = torch.rand(n, generator=g, dtype=torch.float64)
    assert torch.equal(draw(probs[:1].expand(n, 4), u, buf), draw(probs[:1].expand(n, 4), u))


def test_sampler_reuses_its_cdf_buffer():
    import torch

    from tokenops.engine.sampling.sampling import Sampler

    sampler = Sampler(seed=0)
    a = sampler._cdf_buffer(torch.Size([4, 100]))
    b = sampler._cdf_buffer(torch.Size([2, 100]))
    assert a.data_ptr() == b.data_ptr() and b.shape == (2, 100)
    assert sampler._cdf_buffer(torch.Size([1024, 128256])) is None  # too large to keep: draw allocates
