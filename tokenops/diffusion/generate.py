"""One generation: walk a sampler's timesteps from noise to images, with the step cache."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tokenops.diffusion.samplers import make_scheduler
from tokenops.diffusion.step_cache import SplitUNet, StepCache, StepCachePolicy


@dataclass(slots=True)
class GenerationStats:
    sampler: str
    num_steps: int  # denoising steps run
    num_deep: int  # steps that ran the deep path (the others reused it)

    @property
    def cache_reuse_ratio(self) -> float:
        return 1.0 - self.num_deep / self.num_steps if self.num_steps else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "sampler": self.sampler,
            "steps": self.num_steps,
            "deep_steps": self.num_deep,
            "cache_reuse_ratio": round(self.cache_reuse_ratio, 4),
        }


@torch.no_grad()
def generate(
    unet: SplitUNet,
    scheduler_config: Any,
    class_labels: torch.Tensor,
    *,
    sampler: str,
    num_steps: int,
    seed: int | None = None,
    policy: StepCachePolicy | None = None,
) -> tuple[torch.Tensor, GenerationStats]:
    """Images ``(N, C, H, W)`` in [-1, 1] for ``class_labels`` (N of them).

    ``seed`` makes the run reproducible (initial noise and the sampler's noise)."""
    model = unet.unet
    scheduler = make_scheduler(sampler, scheduler_config)
    scheduler.set_timesteps(num_steps)
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed if seed is not None else int(torch.seed() % (2**63)))
    size = model.config.sample_size
    height, width = (size, size) if isinstance(size, int) else size
    shape = (class_labels.shape[0], model.config.in_channels, height, width)
    sample = torch.randn(shape, generator=generator, dtype=model.dtype).to(model.device)
    sample = sample * scheduler.init_noise_sigma
    cache = StepCache(policy)
    labels = class_labels.to(model.device)
    for t in scheduler.timesteps:
        eps = unet(scheduler.scale_model_input(sample, t), t, labels, cache)
        sample = scheduler.step(eps, t, sample, generator=generator).prev_sample
    return sample.clamp(-1, 1), GenerationStats(sampler, cache.num_steps, cache.num_steps - cache.num_reused)
