"""The step cache: reuse the UNet's deep features between adjacent denoising steps.

Adjacent steps of a sampler see nearly the same input, and the deep (low-resolution)
part of a UNet changes slowly between them (the DeepCache observation). Each step
always runs the shallow path (``conv_in``, the first down block, the last up block,
the output convolution); the deep path (every other block) runs only when the
cache refreshes, otherwise its last output is fed to the last up block again.

When to refresh is decided by a change estimate, TeaCache-style: the relative L1
change of the first down block's output between adjacent steps, accumulated since
the last refresh. While the sum stays under ``threshold`` the deep features are
reused; once it reaches it (or after ``max_reuse`` reuses in a row) they are
recomputed and the sum restarts. The shallow output is computed on every step
anyway, so the estimate costs one subtraction.

:class:`SplitUNet` is the forward pass of a diffusers ``UNet2DModel`` split at that
point; with no cache (or ``threshold = 0``) it computes what ``unet(...)`` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(slots=True)
class StepCachePolicy:
    """When the deep features may be reused (set by the ``step_cache`` plugin)."""

    #: accumulated relative L1 change under which the deep features are reused; 0 turns the cache off
    threshold: float = 0.0
    #: most consecutive reuses before a forced refresh
    max_reuse: int = 4
    #: the first steps always run in full (the features change fastest while the image forms)
    warmup_steps: int = 1

    def __post_init__(self) -> None:
        if not self.threshold >= 0:
            raise ValueError(f"step cache threshold must be >= 0, got {self.threshold}")
        if self.max_reuse < 1:
            raise ValueError(f"step cache max_reuse must be >= 1, got {self.max_reuse}")
        if self.warmup_steps < 1:
            raise ValueError(f"step cache warmup_steps must be >= 1, got {self.warmup_steps}")

    @property
    def is_enabled(self) -> bool:
        return self.threshold > 0


class StepCache:
    """The cached deep features of one generation and the counters of its reuse."""

    def __init__(self, policy: StepCachePolicy | None = None) -> None:
        self.policy = policy or StepCachePolicy()
        self.deep: torch.Tensor | None = None
        self._prev_shallow: torch.Tensor | None = None
        self.accumulated = 0.0
        self.num_steps = 0
        self.num_reused = 0
        self._num_reused_in_row = 0

    @property
    def reuse_ratio(self) -> float:
        return self.num_reused / self.num_steps if self.num_steps else 0.0

    def can_reuse(self, shallow: torch.Tensor) -> bool:
        """Whether this step may reuse the deep features, given its shallow features."""
        policy = self.policy
        prev, self._prev_shallow = self._prev_shallow, shallow
        if not policy.is_enabled or self.deep is None or prev is None or self.num_steps < policy.warmup_steps:
            return False
        if self._num_reused_in_row >= policy.max_reuse:
            return False
        self.accumulated += float((shallow - prev).abs().mean() / prev.abs().mean().clamp_min(1e-8))
        return self.accumulated < policy.threshold

    def reuse(self) -> torch.Tensor:
        assert self.deep is not None
        self.num_steps += 1
        self.num_reused += 1
        self._num_reused_in_row += 1
        return self.deep

    def refresh(self, deep: torch.Tensor) -> None:
        self.num_steps += 1
        self.deep = deep if self.policy.is_enabled else None
        self.accumulated = 0.0
        self._num_reused_in_row = 0


class SplitUNet:
    """A diffusers ``UNet2DModel``'s forward pass split into a shallow and a deep path."""

    def __init__(self, unet: Any) -> None:
        config = unet.config
        unsupported = [
            why
            for why, bad in (
                ("skip-connection blocks", any(hasattr(b, "skip_conv") for b in (*unet.down_blocks, *unet.up_blocks))),
                ("fourier time embedding", config.time_embedding_type != "positional"),
                ("class_embed_type", config.class_embed_type is not None),
                ("a single resolution", len(unet.down_blocks) < 2),
            )
            if bad
        ]
        if unsupported:
            raise ValueError(f"the step cache does not support this UNet: {', '.join(unsupported)}")
        self.unet = unet

    def embedding(self, sample: torch.Tensor, timestep: Any, class_labels: torch.Tensor | None) -> torch.Tensor:
        unet = self.unet
        t = torch.as_tensor(timestep, device=sample.device).reshape(-1)
        t = t.expand(sample.shape[0]) if t.numel() == 1 else t
        emb = unet.time_embedding(unet.time_proj(t).to(dtype=unet.dtype))
        if unet.class_embedding is not None:
            if class_labels is None:
                raise ValueError("this UNet is class-conditioned: class_labels are required")
            emb = emb + unet.class_embedding(class_labels).to(dtype=unet.dtype)
        return emb

    def __call__(
        self,
        sample: torch.Tensor,
        timestep: Any,
        class_labels: torch.Tensor | None = None,
        cache: StepCache | None = None,
    ) -> torch.Tensor:
        unet = self.unet
        if unet.config.center_input_sample:
            sample = 2 * sample - 1.0
        emb = self.embedding(sample, timestep, class_labels)
        hidden = unet.conv_in(sample)
        skips: tuple[torch.Tensor, ...] = (hidden,)
        hidden, more = unet.down_blocks[0](hidden_states=hidden, temb=emb)
        skips += more
        last = unet.up_blocks[-1]
        num_last = len(last.resnets)
        assert len(skips) >= num_last, "the last up block takes its skips from conv_in and the first down block"
        shallow = skips[num_last - 1]
        if cache is not None and cache.can_reuse(shallow):
            deep = cache.reuse()
        else:
            deep = self._deep(hidden, skips, emb, num_last)
            if cache is not None:
                cache.refresh(deep)
        out = last(deep, skips[:num_last], emb)
        return unet.conv_out(unet.conv_act(unet.conv_norm_out(out)))

    def _deep(
        self, hidden: torch.Tensor, skips: tuple[torch.Tensor, ...], emb: torch.Tensor, num_last: int
    ) -> torch.Tensor:
        unet = self.unet
        for block in unet.down_blocks[1:]:
            hidden, more = block(hidden_states=hidden, temb=emb)
            skips += more
        if unet.mid_block is not None:
            hidden = unet.mid_block(hidden, emb)
        for block in unet.up_blocks[:-1]:
            n = len(block.resnets)
            hidden = block(hidden, skips[-n:], emb)
            skips = skips[:-n]
        assert len(skips) == num_last
        return hidden
