"""Load memory and time of a GGUF mixture-of-experts model whose experts stay in the file's encoding.

Writes a random Qwen3-MoE-shaped GGUF (``qwen3moe``; default 8 layers, hidden 1024, 16 experts of
width 512, top-4; every 2-D weight in ``--type`` as random blocks with small scales, norms and
routers float32), then builds the engine on it in a fresh process and prints the file size, the
resident weight bytes, the process's RSS growth over the build, the build time, one 32-token prefill
and one decode step, beside what the experts would take dequantized to float32 (the alternative
the loader does not take)::

    .venv/bin/python tests/benchmarks/gguf_moe_load.py
    .venv/bin/python tests/benchmarks/gguf_moe_load.py --type Q8_0 --layers 4 --json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

# block bytes and the byte offsets of the float16 scales inside a block, per type
_BLOCKS = {"Q4_K": (256, 144, (0, 2)), "Q8_0": (32, 34, (0,)), "Q4_0": (32, 18, (0,))}


def _random_blocks(rng, rows: int, cols: int, qtype: str):
    import numpy as np

    per, size, scales = _BLOCKS[qtype]
    raw = rng.integers(0, 256, (rows, cols // per * size), dtype=np.uint8)
    blocks = raw.reshape(-1, size)
    for at in scales:
        blocks[:, at : at + 2] = (
            rng.uniform(1e-4, 4e-4, blocks.shape[0]).astype(np.float16).view(np.uint8).reshape(-1, 2)
        )
    return raw


def write_model(out: Path, a: argparse.Namespace) -> None:
    import gguf
    import numpy as np
    from tokenizers import pre_tokenizers

    rng = np.random.default_rng(0)
    qt = gguf.GGMLQuantizationType[a.type]
    tokens = sorted(pre_tokenizers.ByteLevel.alphabet(), key=ord) + ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    heads, head_dim = a.hidden // 128, 128
    w = gguf.GGUFWriter(str(out), "qwen3moe")
    w.add_block_count(a.layers)
    w.add_context_length(4096)
    w.add_embedding_length(a.hidden)
    w.add_feed_forward_length(a.hidden * 3)
    w.add_head_count(heads)
    w.add_head_count_kv(max(1, heads // 4))
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(a.experts)
    w.add_expert_used_count(a.used)
    w.add_expert_feed_forward_length(a.expert_ff)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t.startswith("<|") else 1 for t in tokens])
    w.add_token_merges([])
    w.add_eos_token_id(len(tokens) - 1)

    def weight(name: str, *shape: int) -> None:  # shape as numpy's: [..., rows, cols]
        rows = int(np.prod(shape[:-1]))
        w.add_tensor(name, _random_blocks(rng, rows, shape[-1], a.type).reshape(*shape[:-1], -1), raw_dtype=qt)

    def vector(name: str, n: int) -> None:
        w.add_tensor(name, (1 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    vocab = len(tokens) + 256 - len(tokens) % 256  # padded rows are never looked up
    weight("token_embd.weight", vocab, a.hidden)
    weight("output.weight", vocab, a.hidden)
    vector("output_norm.weight", a.hidden)
    q, kv = heads * head_dim, max(1, heads // 4) * head_dim
    for i in range(a.layers):
        p = f"blk.{i}."
        for norm, n in (
            ("attn_norm", a.hidden),
            ("ffn_norm", a.hidden),
            ("attn_q_norm", head_dim),
            ("attn_k_norm", head_dim),
        ):
            vector(p + norm + ".weight", n)
        weight(p + "attn_q.weight", q, a.hidden)
        weight(p + "attn_k.weight", kv, a.hidden)
        weight(p + "attn_v.weight", kv, a.hidden)
        weight(p + "attn_output.weight", a.hidden, q)
        w.add_tensor(p + "ffn_gate_inp.weight", (0.05 * rng.standard_normal((a.experts, a.hidden))).astype(np.float32))
        weight(p + "ffn_gate_exps.weight", a.experts, a.expert_ff, a.hidden)
        weight(p + "ffn_up_exps.weight", a.experts, a.expert_ff, a.hidden)
        weight(p + "ffn_down_exps.weight", a.experts, a.hidden, a.expert_ff)
    w.add_vocab_size(vocab)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


_MEASURE = """
import json, resource, sys, time
def rss():
    return int(open('/proc/self/statm').read().split()[1]) * resource.getpagesize()
import torch
from tokenops.engine.core.batch import ChunkInput
from tokenops.engine.core.config import EngineConfig
from tokenops.engine.core.model_runner import ModelRunner
from tokenops.engine.gguf.gguf_weights import weight_bytes
torch.set_num_threads(int(sys.argv[2]))
before, t0 = rss(), time.perf_counter()
runner = ModelRunner(EngineConfig(model=sys.argv[1], device="cpu", block_size=16, kv_cache_tokens=256))
load_s, after = time.perf_counter() - t0, rss()
ids = list(range(10, 42))
t0 = time.perf_counter(); runner.execute([ChunkInput(ids, 0, [0, 1])]); first_s = time.perf_counter() - t0
t0 = time.perf_counter(); runner.execute([ChunkInput(ids, 0, [0, 1])]); prefill_s = time.perf_counter() - t0
steps = [ChunkInput([5], 32 + i, [0, 1, 2]) for i in range(8)]
t0 = time.perf_counter()
for step in steps:
    runner.execute([step])
decode_s = (time.perf_counter() - t0) / len(steps)
print(json.dumps({"rss_growth": after - before, "weight_bytes": weight_bytes(runner._raw_model), "load_s": load_s,
                  "first_step_s": first_s, "prefill32_s": prefill_s, "decode_s": decode_s, "format": runner.weight_format,
                  "expert_load": runner.expert_load()}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--used", type=int, default=4)
    ap.add_argument("--expert-ff", type=int, default=512)
    ap.add_argument("--type", choices=sorted(_BLOCKS), default="Q4_K")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "moe.gguf"
        write_model(path, a)
        file_bytes = path.stat().st_size
        out = subprocess.run([sys.executable, "-c", _MEASURE, str(path), str(a.threads)], capture_output=True,
                             text=True, check=True)  # fmt: skip
    row = json.loads(out.stdout.strip().splitlines()[-1])
    experts_f32 = a.layers * a.experts * 3 * a.hidden * a.expert_ff * 4
    row.update(file_bytes=file_bytes, experts_if_float32=experts_f32)
    if a.json:
        print(json.dumps(row))
        return
    mib = 1 << 20
    print(f"{a.layers} layers, hidden {a.hidden}, {a.experts} experts (top-{a.used}) of width {a.expert_ff}, {a.type}")
    print(f"  file                       {file_bytes / mib:8.1f} MiB   ({row['format']})")
    print(f"  resident weights           {row['weight_bytes'] / mib:8.1f} MiB")
    print(f"  RSS growth over the build  {row['rss_growth'] / mib:8.1f} MiB   in {row['load_s']:.2f} s")
    print(f"  experts as float32 would be {experts_f32 / mib:7.1f} MiB   (not taken: they stay {a.type})")
    print(
        f"  first step {row['first_step_s']:.2f} s (kernel set-up), then a 32-token prefill "
        f"{row['prefill32_s'] * 1e3:.0f} ms, a decode step {row['decode_s'] * 1e3:.1f} ms ({a.threads} threads)"
    )


if __name__ == "__main__":
    main()
