"""The step cache: the split forward equals the UNet's, reuse follows the policy, and on the
demo model cached sampling stays close to uncached sampling."""

import pytest
import torch

from tokenops.diffusion.generate import generate
from tokenops.diffusion.step_cache import SplitUNet, StepCache, StepCachePolicy


def _inputs(n=4):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 1, 8, 8, generator=g), torch.tensor([3, 50, 120, 199][:n]), torch.arange(n)


def test_split_forward_matches_the_unet(tiny_unet):
    x, t, labels = _inputs()
    with torch.no_grad():
        expected = tiny_unet(x, t, labels).sample
        got = SplitUNet(tiny_unet)(x, t, labels)
        scalar_t = SplitUNet(tiny_unet)(x, 77, labels)
        expected_scalar = tiny_unet(x, 77, labels).sample
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(scalar_t, expected_scalar, rtol=1e-5, atol=1e-5)


def test_cache_off_runs_every_step_in_full(tiny_unet):
    cache = StepCache(StepCachePolicy(threshold=0.0))
    split = SplitUNet(tiny_unet)
    x, _, labels = _inputs()
    with torch.no_grad():
        for t in range(10):
            split(x, 199 - t, labels, cache)
    assert (cache.num_steps, cache.num_reused, cache.deep) == (10, 0, None)


def test_reuse_is_capped_by_max_reuse_and_warmup(tiny_unet):
    # a threshold no change reaches: reuse as often as max_reuse allows, after the warm-up steps
    cache = StepCache(StepCachePolicy(threshold=1e9, max_reuse=2, warmup_steps=1))
    split = SplitUNet(tiny_unet)
    x, _, labels = _inputs()
    pattern = []
    with torch.no_grad():
        for t in range(10):
            before = cache.num_reused
            split(x, 199 - t, labels, cache)
            pattern.append("r" if cache.num_reused > before else "F")
    assert "".join(pattern) == "FrrFrrFrrF"
    assert cache.reuse_ratio == pytest.approx(0.6)


def test_reused_step_feeds_the_cached_deep_features(tiny_unet):
    """A reused step computes the last up block on the cached deep output: with the same input
    and timestep as the refreshing step, its output is identical."""
    split = SplitUNet(tiny_unet)
    cache = StepCache(StepCachePolicy(threshold=1e9, max_reuse=4, warmup_steps=1))
    x, _, labels = _inputs()
    with torch.no_grad():
        full = split(x, 100, labels, cache)
        reused = split(x, 100, labels, cache)
    assert cache.num_reused == 1
    torch.testing.assert_close(reused, full)


def test_change_estimate_decides_refresh(tiny_unet):
    """A small threshold refreshes when the input moves a lot and reuses while it barely moves."""
    split = SplitUNet(tiny_unet)
    x, _, labels = _inputs()
    with torch.no_grad():
        still = StepCache(StepCachePolicy(threshold=0.05, max_reuse=8))
        for _ in range(5):
            split(x, 100, labels, still)
        moving = StepCache(StepCachePolicy(threshold=0.05, max_reuse=8))
        for i in range(5):
            split(torch.randn_like(x), 100, labels, moving)
    assert still.num_reused == 4
    assert moving.num_reused == 0


def test_policy_validation():
    with pytest.raises(ValueError):
        StepCachePolicy(threshold=-1)
    with pytest.raises(ValueError):
        StepCachePolicy(max_reuse=0)
    with pytest.raises(ValueError):
        StepCachePolicy(warmup_steps=0)


def test_generate_counts_steps_and_is_reproducible(tiny_unet):
    from diffusers import DDPMScheduler

    config = DDPMScheduler(num_train_timesteps=200, beta_schedule="squaredcos_cap_v2").config
    split = SplitUNet(tiny_unet)
    labels = torch.tensor([1, 7])
    a, stats = generate(split, config, labels, sampler="ddim", num_steps=12, seed=5,
                        policy=StepCachePolicy(threshold=1e9, max_reuse=1))
    b, _ = generate(split, config, labels, sampler="ddim", num_steps=12, seed=5,
                    policy=StepCachePolicy(threshold=1e9, max_reuse=1))
    assert a.shape == (2, 1, 8, 8) and float(a.abs().max()) <= 1.0
    torch.testing.assert_close(a, b)
    assert (stats.num_steps, stats.num_deep) == (12, 6)
    assert stats.cache_reuse_ratio == pytest.approx(0.5)


def test_demo_model_cached_sampling_keeps_the_digit(demo_model):
    """On the trained demo model a moderate threshold skips deep steps and the classifier still
    reads the requested digits about as often as without the cache."""
    labels = torch.arange(10).repeat_interleave(4)
    plain, plain_stats = demo_model.generate(labels, sampler="ddim", num_steps=20, seed=0)
    cached, stats = demo_model.generate(labels, sampler="ddim", num_steps=20, seed=0,
                                        policy=StepCachePolicy(threshold=0.3, max_reuse=2))
    assert plain_stats.num_deep == 20 and stats.num_deep < 20
    acc_plain = float((demo_model.classifier.predict(plain) == labels).float().mean())
    acc_cached = float((demo_model.classifier.predict(cached) == labels).float().mean())
    assert acc_plain >= 0.8
    assert acc_cached >= acc_plain - 0.1
    assert float((cached - plain).abs().mean()) < 0.25  # same seed: close to the uncached images
