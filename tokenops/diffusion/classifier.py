"""A small CNN that recognises the demo model's digits: it scores generated images.

Trained by ``scripts/train_demo_diffusion.py`` on the same (upscaled) digits the
diffusion model learned, saved beside the pipeline as ``classifier/`` (config.json +
model.safetensors). Inputs are images in [-1, 1], shape ``(N, 1, H, W)``."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn


class DigitClassifier(nn.Module):
    def __init__(self, size: int = 16, num_classes: int = 10, channels: int = 32) -> None:
        super().__init__()
        self.size = size
        self.num_classes = num_classes
        self.channels = channels
        self.net = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(channels, 2 * channels, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Dropout(0.2),
            nn.Linear(2 * channels * (size // 4) ** 2, num_classes),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images)

    @torch.no_grad()
    def predict(self, images: torch.Tensor) -> torch.Tensor:
        """The most likely class of each image."""
        was_training = self.training
        self.eval()
        try:
            return self(images.float()).argmax(-1)
        finally:
            self.train(was_training)

    def save(self, folder: Path | str) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(
            json.dumps({"size": self.size, "num_classes": self.num_classes, "channels": self.channels}, indent=2) + "\n"
        )
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, str(folder / "model.safetensors"))

    @classmethod
    def load(cls, folder: Path | str) -> DigitClassifier:
        from safetensors.torch import load_file

        folder = Path(folder)
        config = json.loads((folder / "config.json").read_text())
        model = cls(**config)
        model.load_state_dict(load_file(str(folder / "model.safetensors")))
        return model.eval()
