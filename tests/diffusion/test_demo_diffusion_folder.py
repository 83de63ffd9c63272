"""The shipped digits-diffusion folder: complete, small, packaged, and as good as its report says."""

import fnmatch
import json
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "tokenops" / "demo_models" / "digits-diffusion"
pytestmark = pytest.mark.skipif(not (FOLDER / "model_index.json").is_file(), reason="demo diffusion model not shipped")
FILES = ["model_index.json", "tokenops.json", "training_report.json", "unet/config.json",
         "unet/diffusion_pytorch_model.safetensors", "scheduler/scheduler_config.json", "classifier/config.json",
         "classifier/model.safetensors"]


def test_folder_is_complete_and_small():
    for name in FILES:
        assert (FOLDER / name).is_file(), name
    total = sum(f.stat().st_size for f in FOLDER.rglob("*") if f.is_file())
    assert total < 5 * 2**20, f"{total / 2**20:.1f} MiB"


def test_package_data_ships_every_file():
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["tokenops"]
    for f in FOLDER.rglob("*"):
        if f.is_file():
            rel = f.relative_to(ROOT / "tokenops").as_posix()
            # setuptools globs: '*' does not cross '/'
            assert any(fnmatch.fnmatch(rel, p) and rel.count("/") == p.count("/") for p in patterns), rel


def test_training_report_figures():
    report = json.loads((FOLDER / "training_report.json").read_text())
    assert report["classifier"]["test_accuracy"] >= 0.95
    assert all(s["classifier_accuracy"] >= 0.85 for s in report["samples"]), report["samples"]


def test_default_serve_lists_the_demo_model():
    from tokenops.backends.registry import DEMO_DIFFUSION_NAME, default_model_configs

    configs = {m.name: m for m in default_model_configs()}
    assert configs[DEMO_DIFFUSION_NAME].backend == "diffusion"
    assert Path(configs[DEMO_DIFFUSION_NAME].path) == FOLDER
