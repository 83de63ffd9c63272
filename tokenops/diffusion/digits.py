"""scikit-learn's 8x8 digits as diffusion training data: upscaled, scaled to [-1, 1].

Only the training script, the tests and the benchmark import this (scikit-learn is
in the ``diffusion`` extra); serving needs none of it."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def load_digit_images(size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images, labels)``: float images ``(N, 1, size, size)`` in [-1, 1] and int64 labels 0-9."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0  # pixel values are 0..16
    if size != images.shape[-1]:
        images = F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)
    return images.clamp(0, 1) * 2 - 1, torch.tensor(digits.target, dtype=torch.long)


def split(num: int, test_fraction: float = 0.2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of a seeded train/test split of ``num`` items."""
    order = torch.randperm(num, generator=torch.Generator().manual_seed(seed))
    num_test = int(num * test_fraction)
    return order[num_test:], order[:num_test]
