"""Whose perplexity is nearer the file's own weights: tokenops and ``llama-perplexity`` on a quantized
GGUF and on the same weights written back as float32 (no activation rounding on either side).

``models_vs_llamacpp.py`` compares the two on the quantized file, where each rounds the activations
before its integer products: tokenops to two bytes per value (~3e-5 of the largest output), llama.cpp
to one (Q8_0 / Q8_K blocks, ~7e-3). On the float32 copy both multiply float32 activations, so their
figures should agree to rounding; the quantized file's figures then say how far each side's
activation rounding moves it. Same text, windows and scoring as ``models_vs_llamacpp.py``
(``gguf_parity.windows``: BOS per window where the model adds one, second halves scored).

    .venv/bin/python tests/benchmarks/perplexity_f32_reference.py ~/.cache/tokenops/ggufs/gemma-3-270m-q4_k_m.gguf \\
        [--chunks 8] [--threads 1] [--keep DIR]

The float32 copy is 4 bytes a weight (Gemma 3 270M: 1.1 GB; made once in ``--keep``, else a
temporary folder). ``llama-perplexity`` comes from ``scripts/build_llamacpp.sh``'s folder.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def write_f32(src: Path, dst: Path) -> Path:
    """``src`` with every tensor dequantized to float32; metadata kept (file type ALL_F32)."""
    import gguf
    import numpy as np

    if dst.is_file():
        return dst
    reader = gguf.GGUFReader(str(src))
    writer = gguf.GGUFWriter(str(dst), reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = int(gguf.LlamaFileType.ALL_F32) if key == "general.file_type" else field.contents()
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, field.types[0], sub_type=sub)
    for t in reader.tensors:
        data = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
        writer.add_tensor(t.name, data, raw_dtype=gguf.GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def tokenops_perplexity(model: Path, wins: list[list[int]], threads: int) -> float:
    import torch
    from gguf_parity import our_logits, window_nll
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.model_runner import ModelRunner

    torch.set_num_threads(threads)
    ctx = len(wins[0])
    runner = ModelRunner(
        EngineConfig(
            model=str(model),
            device="cpu",
            block_size=16,
            kv_cache_tokens=ctx + 64,
            max_num_batched_tokens=max(512, ctx),
            torch_threads=threads,
        )
    )
    nll, count = 0.0, 0
    for ids in wins:
        n, c = window_nll(our_logits(runner, ids), ids)
        nll, count = nll + n, count + c
    return math.exp(nll / count)


def main() -> None:
    import llamacpp_peer as lp
    from gguf_parity import held_out_texts, llamacpp_perplexity, windows

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("gguf", type=Path)
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--chunks", type=int, default=8)
    p.add_argument("--threads", type=int, default=1, help="both sides (llama-perplexity's accuracy needs no more)")
    p.add_argument("--offset", type=int, default=15000, help="first ShareGPT conversation used (held out)")
    p.add_argument("--keep", type=Path, default=None, help="folder for the float32 copy (kept for a rerun)")
    args = p.parse_args()
    tool = lp.script_bin_dir() / "llama-perplexity"
    if not tool.is_file():
        raise SystemExit(f"no {tool}: run scripts/build_llamacpp.sh")
    text = "\n\n".join(held_out_texts(args.offset, 600)[200:])  # models_vs_llamacpp.py's text
    with tempfile.TemporaryDirectory(prefix="tokenops-f32-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        f32 = write_f32(args.gguf, folder / f"{args.gguf.stem}-f32.gguf")
        print(
            f"float32 copy: {f32} ({f32.stat().st_size >> 20} MiB, {time.perf_counter() - started:.0f} s)", flush=True
        )
        wins, _, _ = windows(args.gguf, text, args.ctx, args.chunks)
        rows = []
        for name, model in (("quantized", args.gguf), ("float32", f32)):
            ours = tokenops_perplexity(model, wins, args.threads)
            theirs = llamacpp_perplexity(tool, model, text, args.ctx, len(wins), args.threads, Path(tmp))
            rows.append((name, ours, theirs))
            print(f"  {name}: tokenops {ours:.4f}, llama.cpp {theirs:.4f}", flush=True)
    print(f"\n{args.gguf.name}: {len(wins)} x {args.ctx} tokens")
    print(f"{'weights':<10} {'tokenops':>9} {'llama.cpp':>9} {'ratio':>8}")
    for name, ours, theirs in rows:
        print(f"{name:<10} {ours:9.4f} {theirs:9.4f} {ours / theirs - 1:+8.2%}")
    (_, oq, tq), (_, of, tf) = rows
    print(
        f"each side's quantized run against its float32 run: tokenops {oq / of - 1:+.2%}, llama.cpp {tq / tf - 1:+.2%}"
    )


if __name__ == "__main__":
    main()
