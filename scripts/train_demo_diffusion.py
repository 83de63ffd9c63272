"""Train the demo diffusion model (digits-diffusion) and its digit classifier, offline on CPU.

Data: scikit-learn's 8x8 handwritten digits (1,797 images, shipped inside the
package), scaled to [-1, 1] (``--size`` 16 upscales them bilinearly). The model is a
class-conditioned diffusers ``UNet2DModel`` (a class embedding added to the time
embedding: prompt "7" -> class 7) trained with the epsilon objective on a cosine
DDPM schedule, with an exponential moving average of the weights. The classifier
is a small CNN (:mod:`tokenops.diffusion.classifier`) trained on the same images.

Writes ``tokenops/demo_models/digits-diffusion/``: a diffusers pipeline folder
(``model_index.json``, ``unet/``, ``scheduler/``), ``classifier/``, ``tokenops.json``
(how prompts map to classes) and ``training_report.json`` (losses, classifier test
accuracy, sample accuracy).

    nice -n 10 .venv/bin/python scripts/train_demo_diffusion.py            # 14 min budget (--minutes); 29 min on a busy 2-core box
    nice -n 10 .venv/bin/python scripts/train_demo_diffusion.py --report-only
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tokenops.diffusion.classifier import DigitClassifier  # noqa: E402
from tokenops.diffusion.digits import load_digit_images, split  # noqa: E402

DEFAULT_OUT = REPO / "tokenops" / "demo_models" / "digits-diffusion"
LABELS = [str(i) for i in range(10)]
ALIASES = {"zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
           "nine": 9}


def build_unet(size: int):
    from diffusers import UNet2DModel

    return UNet2DModel(
        sample_size=size, in_channels=1, out_channels=1, layers_per_block=1,
        block_out_channels=(32, 64, 64), down_block_types=("DownBlock2D", "DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D", "UpBlock2D"), norm_num_groups=8, attention_head_dim=16,
        num_class_embeds=len(LABELS),
    )


def train_classifier(images: torch.Tensor, labels: torch.Tensor, epochs: int, seed: int) -> tuple[DigitClassifier, dict]:
    torch.manual_seed(seed)
    train, test = split(len(images), seed=seed)
    model = DigitClassifier(size=images.shape[-1])
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    start = time.time()
    for _ in range(epochs):
        model.train()
        for idx in train[torch.randperm(len(train))].split(64):
            x = images[idx]
            x = (x + 0.1 * torch.randn_like(x)).clamp(-1, 1)  # robust to the slight noise of generated samples
            loss = F.cross_entropy(model(x), labels[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    accuracy = float((model.predict(images[test]) == labels[test]).float().mean())
    print(f"classifier: test accuracy {accuracy:.4f} ({len(test)} held-out images, {time.time() - start:.0f} s)")
    return model.eval(), {"test_accuracy": round(accuracy, 4), "num_test": len(test), "epochs": epochs,
                          "num_params": sum(p.numel() for p in model.parameters())}


def train_unet(images: torch.Tensor, labels: torch.Tensor, args: argparse.Namespace):
    from diffusers import DDPMScheduler
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    torch.manual_seed(args.seed)
    unet = build_unet(images.shape[-1])
    scheduler = DDPMScheduler(num_train_timesteps=args.timesteps, beta_schedule="squaredcos_cap_v2",
                              prediction_type="epsilon", clip_sample=True)
    ema = AveragedModel(unet, multi_avg_fn=get_ema_multi_avg_fn(args.ema))
    opt = torch.optim.AdamW(unet.parameters(), lr=args.lr, weight_decay=1e-4)
    num_steps = args.steps
    losses: list[float] = []
    start = time.time()
    step = 0
    while step < num_steps:
        idx = torch.randint(0, len(images), (args.batch_size,))
        x0, y = images[idx], labels[idx]
        noise = torch.randn_like(x0)
        t = torch.randint(0, args.timesteps, (len(idx),))
        pred = unet(scheduler.add_noise(x0, noise, t), t, y).sample
        loss = F.mse_loss(pred, noise)
        lr = args.lr * 0.5 * (1 + math.cos(math.pi * step / num_steps))  # cosine decay
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(unet.parameters(), 1.0)
        opt.step()
        ema.update_parameters(unet)
        losses.append(float(loss))
        step += 1
        if step == 20 and args.minutes:  # calibrate the step count to the time budget
            per_step = (time.time() - start) / step
            num_steps = max(step + 1, min(num_steps, int(args.minutes * 60 / per_step)))
            print(f"unet: {per_step:.2f} s/step -> {num_steps} steps")
        if step % 100 == 0:
            print(f"unet step {step}/{num_steps}: loss {sum(losses[-100:]) / 100:.4f} ({time.time() - start:.0f} s)",
                  flush=True)
    model = ema.module.eval()
    report = {"num_params": sum(p.numel() for p in model.parameters()), "num_steps": step,
              "batch_size": args.batch_size, "peak_lr": args.lr, "ema": args.ema, "seed": args.seed,
              "train_minutes": round((time.time() - start) / 60, 2),
              "final_train_loss": round(sum(losses[-100:]) / len(losses[-100:]), 4),
              "num_train_timesteps": args.timesteps, "beta_schedule": "squaredcos_cap_v2"}
    return model, scheduler, report


def sample_accuracy(folder: Path, sampler: str, steps: int, per_class: int, seed: int) -> dict:
    """Generate ``per_class`` images of each digit and score them with the classifier."""
    from tokenops.diffusion.model import DiffusionModel

    model = DiffusionModel.load(folder)
    labels = torch.arange(10).repeat_interleave(per_class)
    start = time.time()
    images, _ = model.generate(labels, sampler=sampler, num_steps=steps, seed=seed)
    accuracy = float((model.classifier.predict(images) == labels).float().mean())
    print(f"samples ({sampler}, {steps} steps): classifier accuracy {accuracy:.4f} on {len(labels)} images "
          f"({time.time() - start:.0f} s)")
    return {"sampler": sampler, "steps": steps, "num_images": len(labels), "seed": seed,
            "classifier_accuracy": round(accuracy, 4)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--size", type=int, default=8, help="image side: 8 (native) or 16 (upscaled)")
    p.add_argument("--steps", type=int, default=3000, help="UNet optimizer steps (at most)")
    p.add_argument("--minutes", type=float, default=14.0, help="time budget for the UNet (0: run --steps)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--ema", type=float, default=0.995)
    p.add_argument("--timesteps", type=int, default=200, help="training noise levels (the full DDPM step count)")
    p.add_argument("--classifier-epochs", type=int, default=30)
    p.add_argument("--eval-per-class", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a shared CPU)")
    p.add_argument("--report-only", action="store_true", help="evaluate the saved folder only")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    out: Path = args.out
    report_path = out / "training_report.json"
    if not args.report_only:
        from diffusers import DDPMPipeline

        images, labels = load_digit_images(args.size)
        classifier, classifier_report = train_classifier(images, labels, args.classifier_epochs, args.seed)
        unet, scheduler, unet_report = train_unet(images, labels, args)
        out.mkdir(parents=True, exist_ok=True)
        DDPMPipeline(unet=unet, scheduler=scheduler).save_pretrained(out, safe_serialization=True)
        classifier.save(out / "classifier")
        (out / "tokenops.json").write_text(json.dumps(
            {"labels": LABELS, "aliases": ALIASES, "dataset": "sklearn.datasets.load_digits",
             "image_size": args.size, "default_sampler": "ddpm", "default_steps": args.timesteps}, indent=2) + "\n")
        report = {"unet": unet_report, "classifier": classifier_report,
                  "data": {"num_images": len(images), "size": args.size, "source": "sklearn.datasets.load_digits"}}
    else:
        report = json.loads(report_path.read_text())
    report["samples"] = [sample_accuracy(out, "ddpm", args.timesteps, args.eval_per_class, args.seed),
                         sample_accuracy(out, "ddim", 50, args.eval_per_class, args.seed)]
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
