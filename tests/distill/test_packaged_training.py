"""Issue 21: ``tokenops distill train|eval`` run from an installed wheel, not only a checkout.

The training code lives in the package: ``tokenops/training/chat.py`` (chat template, schedule,
HF writer) and ``tokenops_plugins/multi_model/_task_training.py`` (the task training, next to
the suites; ``scripts/task_training.py`` re-exports it). The distill modules must never reach
into ``scripts/``, and the wheel must carry both."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_PROBE = """
import json, sys
import tokenops.training, tokenops.training.chat, tokenops_plugins.multi_model._task_training
import tokenops_plugins.distill._kd, tokenops_plugins.distill._evaluation, tokenops_plugins.distill._cli
from tokenops_plugins.distill._kd import resolve_model
scripts = {m: getattr(mod, "__file__", None) for m, mod in list(sys.modules.items())
           if "/scripts/" in (getattr(mod, "__file__", None) or "")}
print(json.dumps({"scripts_modules": scripts, "task_training": "task_training" in sys.modules,
                  "train_demo_models": "train_demo_models" in sys.modules,
                  "scripts_on_path": [p for p in sys.path if p.rstrip("/").endswith("scripts")],
                  "student": str(resolve_model("ladder-small"))}))
"""


def test_distill_modules_never_import_scripts(tmp_path):
    out = subprocess.run([sys.executable, "-c", _PROBE], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["scripts_modules"] == {} and not seen["task_training"] and not seen["train_demo_models"]
    assert seen["scripts_on_path"] == []
    assert Path(seen["student"], "config.json").exists()  # bundled models resolve from the package, not the cwd


def test_scripts_reexport_the_package_code():
    """scripts/task_training.py is a re-export, not a second copy."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import task_training
        import train_demo_models
    finally:
        sys.path.remove(str(REPO / "scripts"))
    from tokenops.training import chat
    from tokenops_plugins.multi_model import _task_training as tasks

    assert task_training.finetune is tasks.finetune and task_training.recall_pair is tasks.recall_pair
    assert train_demo_models.render is chat.render and train_demo_models.save_model is chat.save_model
    assert len((REPO / "scripts" / "task_training.py").read_text().splitlines()) < 15


def test_wheel_contains_the_training_package(tmp_path):
    """Build the wheel from a copy of the sources (without the 60 MB of demo models, for speed)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "demo_models", "*.pyc")
    shutil.copytree(REPO / "tokenops", src / "tokenops", ignore=ignore)
    shutil.copytree(REPO / "tokenops_plugins", src / "tokenops_plugins", ignore=ignore)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                          "-q", "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    wheel = next((tmp_path / "dist").glob("tokenops-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"tokenops/training/{p.name}" for p in (REPO / "tokenops" / "training").glob("*.py")}
    assert {"tokenops/training/__init__.py", "tokenops/training/chat.py"} <= expected
    expected |= {"tokenops_plugins/multi_model/_task_training.py", "tokenops_plugins/multi_model/_suites.py"}
    assert expected <= names, sorted(expected - names)
    assert "tokenops_plugins/distill/_kd.py" in names
    assert not any(n.startswith("scripts/") for n in names)
