"""A loaded diffusion pipeline folder: UNet, noise schedule, prompt labels, optional classifier.

The folder is what diffusers' ``save_pretrained`` writes for a UNet pipeline
(``model_index.json``, ``unet/``, ``scheduler/``) plus tokenops' ``tokenops.json``::

    {"labels": ["0", ..., "9"], "aliases": {"seven": 7, ...}, "default_sampler": "ddpm", "default_steps": 200}

``labels`` name the classes of a class-conditioned UNet; a prompt names one of them
("7", "draw a 7", "seven"). A ``classifier/`` folder, when present, scores samples.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tokenops.diffusion.generate import GenerationStats, generate
from tokenops.diffusion.samplers import check_steps
from tokenops.diffusion.step_cache import SplitUNet, StepCachePolicy


class PromptError(ValueError):
    """A prompt that names none of the model's classes."""


@dataclass(slots=True)
class PromptLabels:
    labels: list[str]
    aliases: dict[str, int] = field(default_factory=dict)

    def class_for(self, prompt: str) -> int:
        """The class a prompt names: the first label or alias that appears in it as a word."""
        words = {
            **{label.lower(): i for i, label in enumerate(self.labels)},
            **{k.lower(): int(v) for k, v in self.aliases.items()},
        }
        best: tuple[int, int] | None = None
        for word, index in words.items():
            match = re.search(rf"(?<![\w]){re.escape(word)}(?![\w])", prompt.lower())
            if match and (best is None or match.start() < best[0]):
                best = (match.start(), index)
        if best is None:
            raise PromptError(
                f"the prompt names none of this model's classes; name one of: {', '.join(self.labels)} "
                f'(for example "draw a {self.labels[-1]}")'
            )
        return best[1]


class DiffusionModel:
    """What the ``diffusion`` backend serves: load once, then :meth:`generate` per request."""

    def __init__(
        self, unet: Any, scheduler_config: Any, prompts: PromptLabels, info: dict[str, Any], classifier: Any = None
    ) -> None:
        self.unet = unet.eval()
        self.split = SplitUNet(unet)
        self.scheduler_config = scheduler_config
        self.prompts = prompts
        self.info = info
        self.classifier = classifier
        self.num_train_timesteps = int(scheduler_config["num_train_timesteps"])
        size = unet.config.sample_size
        self.image_size = (size, size) if isinstance(size, int) else tuple(size)

    @classmethod
    def load(cls, folder: Path | str, device: str = "cpu") -> DiffusionModel:
        from diffusers import DDPMScheduler, UNet2DModel

        folder = Path(folder)
        if not (folder / "unet" / "config.json").is_file():
            raise FileNotFoundError(f"{folder} is not a diffusers UNet pipeline folder (no unet/config.json)")
        # float32 at load (the weights may be stored in bf16); no accelerate needed for a model this small
        unet = UNet2DModel.from_pretrained(folder / "unet", torch_dtype=torch.float32, low_cpu_mem_usage=False)
        unet = unet.to(device)
        scheduler_config = DDPMScheduler.load_config(folder / "scheduler")
        info_path = folder / "tokenops.json"
        info = json.loads(info_path.read_text()) if info_path.is_file() else {}
        num_classes = unet.config.num_class_embeds or 0
        labels = info.get("labels") or [str(i) for i in range(num_classes)]
        if num_classes and len(labels) != num_classes:
            raise ValueError(f"{info_path}: {len(labels)} labels for a UNet with {num_classes} classes")
        classifier = None
        if (folder / "classifier" / "config.json").is_file():
            from tokenops.diffusion.classifier import DigitClassifier

            classifier = DigitClassifier.load(folder / "classifier")
        return cls(unet, scheduler_config, PromptLabels(labels, info.get("aliases") or {}), info, classifier)

    @property
    def default_sampler(self) -> str:
        return str(self.info.get("default_sampler", "ddpm"))

    @property
    def default_steps(self) -> int:
        return int(self.info.get("default_steps", self.num_train_timesteps))

    def generate(
        self,
        class_labels: torch.Tensor,
        *,
        sampler: str | None = None,
        num_steps: int | None = None,
        seed: int | None = None,
        policy: StepCachePolicy | None = None,
    ) -> tuple[torch.Tensor, GenerationStats]:
        """Images in [-1, 1], ``(N, C, H, W)``, one per class label."""
        steps = check_steps(
            num_steps if num_steps is not None else self.default_steps,
            self.num_train_timesteps,
            sampler or self.default_sampler,
        )
        return generate(
            self.split,
            self.scheduler_config,
            class_labels,
            sampler=sampler or self.default_sampler,
            num_steps=steps,
            seed=seed,
            policy=policy,
        )
