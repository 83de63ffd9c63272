"""Rotary position embeddings: the frequency tables of every supported RoPE variant,
partial rotation (Phi-3's ``partial_rotary_factor``) and per-layer bases (Gemma 3's local
and global layers).

The arithmetic follows ``transformers`` step for step (float32 frequencies, ``cat(freqs,
freqs)``, cos/sin scaled by the variant's attention factor) so greedy output matches it
exactly in the tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope")


@dataclass(frozen=True, slots=True)
class RopeSpec:
    """One rotary table: base, scaling dict (HF's ``rope_parameters`` minus ``rope_theta``)
    and how many leading dimensions of each head rotate."""

    theta: float
    rotary_dim: int
    max_position_embeddings: int
    scaling: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        rope_type = self.rope_type
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"unsupported rope_type {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
        if rope_type == "longrope":
            for key in ("short_factor", "long_factor", "original_max_position_embeddings"):
                if key not in self.scaling:
                    raise ValueError(f"longrope scaling lacks {key!r}")
            if len(self.scaling["short_factor"]) != self.rotary_dim // 2:
                raise ValueError(
                    f"longrope short_factor has {len(self.scaling['short_factor'])} values for "
                    f"{self.rotary_dim // 2} frequencies"
                )

    @property
    def rope_type(self) -> str:
        return self.scaling.get("rope_type", "default")

    @property
    def is_longrope(self) -> bool:
        return self.rope_type == "longrope"

    @property
    def original_max_positions(self) -> int:
        """LongRoPE: sequences up to this length use the short factors, longer ones the long."""
        return int(self.scaling["original_max_position_embeddings"])

    def attention_factor(self) -> float:
        """The factor cos and sin are multiplied by (1.0 except for LongRoPE)."""
        if not self.is_longrope:
            return 1.0
        if self.scaling.get("attention_factor") is not None:
            return float(self.scaling["attention_factor"])
        factor = self.scaling.get("factor") or self.max_position_embeddings / self.original_max_positions
        return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(self.original_max_positions))

    def inv_freq(self, long: bool = False) -> torch.Tensor:
        """Inverse frequencies ``[rotary_dim // 2]`` (``long``: LongRoPE's long factors)."""
        dim = self.rotary_dim
        exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        s = self.scaling
        if self.is_longrope:
            ext = torch.tensor(s["long_factor"] if long else s["short_factor"], dtype=torch.float32)
            return 1.0 / (ext * self.theta**exponents)
        inv_freq = 1.0 / (self.theta**exponents)
        if self.rope_type == "linear":
            return inv_freq / s["factor"]
        if self.rope_type == "llama3":
            factor = s["factor"]
            low, high = s["low_freq_factor"], s["high_freq_factor"]
            old_len = s["original_max_position_embeddings"]
            wavelen = 2 * math.pi / inv_freq
            scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
            # Between the two wavelengths the frequency is interpolated smoothly.
            smooth = (old_len / wavelen - low) / (high - low)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            is_medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
            return torch.where(is_medium, smoothed, scaled)
        return inv_freq


def rope_cos_sin(
    inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype, attention_factor: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[T, 1, rotary_dim]`` cos and sin for the step's positions (computed once per step)."""
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    if attention_factor != 1.0:
        cos, sin = cos * attention_factor, sin * attention_factor
    return cos.to(dtype)[:, None, :], sin.to(dtype)[:, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` dimensions of each head; the rest pass through."""
    rotary_dim = cos.shape[-1]
    if rotary_dim < x.shape[-1]:
        return torch.cat((apply_rope(x[..., :rotary_dim], cos, sin), x[..., rotary_dim:]), dim=-1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
