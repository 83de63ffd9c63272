"""LoRA adapters against transformers + peft: a tiny random Llama and peft-made random adapters
(``init_lora_weights=False``, B scaled up so the adapters change greedy choices). Each adapter row
of a mixed batch must equal the peft-merged model's greedy output; base rows equal the base."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tiny_models import load_hf_model
from tokenops.engine.core.config import EngineConfig
from tokenops.engine.core.engine import LLMEngine
from tokenops.engine.lora.lora_adapters import AdapterError
from tokenops.engine.sampling.sampling import SamplingParams

peft = pytest.importorskip("peft")
NUM_NEW = 8
BLOCK = 4
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
#: adapter name -> (rank, alpha, targets, rslora, seed)
ADAPTERS = {"alpha": (8, 16, ALL, False, 1), "beta": (4, 8, ["q_proj", "v_proj", "down_proj"], True, 2)}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_adapter(base_dir, out_dir, rank, alpha, targets, rslora, seed):
    torch.manual_seed(seed)
    hf = load_hf_model(base_dir)
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, use_rslora=rslora,
                             init_lora_weights=False, lora_dropout=0.0)
    model = peft.get_peft_model(hf, config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(20.0)  # peft's random B is tiny; a visible change of the greedy choices
    model.save_pretrained(str(out_dir))
    return out_dir


@pytest.fixture(scope="module")
def lora_setup(tiny_llama_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    dirs = {name: make_adapter(tiny_llama_dir, root / name, *spec) for name, spec in ADAPTERS.items()}
    return tiny_llama_dir, dirs


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(5)
    shared = torch.randint(0, 300, (9,), generator=g).tolist()
    return [shared + torch.randint(0, 300, (3 + 2 * i,), generator=g).tolist() for i in range(2)]


@torch.no_grad()
def hf_greedy(hf, ids: list[int]) -> list[int]:
    hf.generation_config.eos_token_id = None
    out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                      do_sample=False, max_new_tokens=NUM_NEW, min_new_tokens=NUM_NEW, pad_token_id=0)
    return out[0, len(ids):].tolist()


def tensor_bytes(adapter_dir) -> int:
    """Bytes of the matrices in the adapter's safetensors file (the file less its 8-byte length and JSON header)."""
    f = Path(adapter_dir) / "adapter_model.safetensors"
    with open(f, "rb") as fh:
        header = int.from_bytes(fh.read(8), "little")
    return f.stat().st_size - 8 - header


def merged(base_dir, adapter_dir):
    return peft.PeftModel.from_pretrained(load_hf_model(base_dir), str(adapter_dir)).merge_and_unload()


def make_engine(base_dir, **kw) -> LLMEngine:
    config = EngineConfig(model=str(base_dir), device="cpu", torch_threads=1, block_size=BLOCK,
                          kv_cache_tokens=64 * BLOCK, max_num_batched_tokens=64, max_num_seqs=8, **kw)
    return LLMEngine(config)


@pytest.fixture(scope="module")
def expected(lora_setup):
    """transformers + peft's greedy tokens per adapter (None: the base) and prompt."""
    base_dir, dirs = lora_setup
    out = {None: [hf_greedy(load_hf_model(base_dir), p) for p in prompts()]}
    for name, d in dirs.items():
        hf = merged(base_dir, d)
        out[name] = [hf_greedy(hf, p) for p in prompts()]
    assert out["alpha"] != out[None] and out["beta"] != out[None]
    return out


@pytest.mark.parametrize("kernel", ["native", "torch"])
def test_mixed_batch_equals_peft_merged(lora_setup, expected, kernel):
    """The fused native step (adapter products in C) and the PyTorch forward (hooks) alike."""
    base_dir, dirs = lora_setup
    engine = make_engine(base_dir, decode_kernel=kernel)
    for name, d in dirs.items():
        info = engine.load_lora(name, str(d))
        # held: exactly the file's float32 matrices, no block-diagonal zeros
        assert info["bytes"] == tensor_bytes(d) and info["file_bytes"] == (d / "adapter_model.safetensors").stat().st_size
    names = [None, "alpha", "beta"]
    # every prompt under every adapter in ONE batch: same tokens, so a shared KV block would show;
    # interleaved (the fused step orders the chunks by adapter and must give the logits back in order)
    batch = [(n, p) for p in prompts() for n in names]
    params = SamplingParams(temperature=0, max_tokens=NUM_NEW, ignore_eos=True)
    for _ in range(2):  # the second round hits the prefix cache, per adapter
        outs = engine.generate([p for _, p in batch], params, loras=[n for n, _ in batch])
        got = {n: [] for n in names}
        for (n, _), o in zip(batch, outs):
            got[n].append(o.outputs[0].token_ids)
        assert got == expected
    stats = engine.stats()
    assert stats["prefix_cache_hits"] > 0
    assert stats["lora"]["steps"] > 0 and {a["name"] for a in stats["lora"]["adapters"]} == {"alpha", "beta"}
    # every adapter step stays on the fused step when it is on
    assert stats["lora"]["fused_steps"] == (stats["lora"]["steps"] if kernel == "native" else 0)
    # unloading leaves the base untouched and the adapter unknown
    engine.unload_lora("beta")
    assert engine.generate(prompts()[:1], params)[0].outputs[0].token_ids == expected[None][0]
    with pytest.raises(ValueError, match="not loaded"):
        engine.add_request("x", prompts()[0], params, lora="beta")


def _copy(src, dst, **config_changes):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "adapter_config.json").read_text())
    cfg.update(config_changes)
    (dst / "adapter_config.json").write_text(json.dumps(cfg))
    return dst


def test_bad_adapters_are_refused_and_change_nothing(lora_setup, tmp_path, tiny_checkpoint):
    base_dir, dirs = lora_setup
    engine = make_engine(base_dir)
    engine.load_lora("alpha", str(dirs["alpha"]))
    other = tiny_checkpoint("qwen3")  # another base: head_dim 32, so the q/k/v shapes differ
    foreign = make_adapter(other, tmp_path / "foreign", 4, 8, ["q_proj"], False, 3)
    (tmp_path / "empty").mkdir()
    missing = _copy(dirs["beta"], tmp_path / "missing")
    (missing / "adapter_model.safetensors").unlink()
    cases = {
        "rank": (_copy(dirs["beta"], tmp_path / "rank", r=16), "rank 16"),
        "base": (_copy(dirs["beta"], tmp_path / "base", base_model_name_or_path="org/another-model"), "another-model"),
        "dora": (_copy(dirs["beta"], tmp_path / "dora", use_dora=True), "use_dora"),
        "missing": (missing, "adapter_model.safetensors"),
        "empty": (tmp_path / "empty", "adapter_config.json"),
    }
    for name, (path, needle) in cases.items():
        with pytest.raises(AdapterError, match=needle):
            engine.load_lora(name, str(path))
    with pytest.raises(AdapterError, match="another base"):
        engine.load_lora("foreign", str(foreign), check_base=False)
    with pytest.raises(AdapterError, match="already loaded"):
        engine.load_lora("alpha", str(dirs["beta"]))
    assert engine.lora_names() == ["alpha"]
    assert engine.runner.lora.adapters["alpha"].targets == tuple(ALL)


def write_random_adapter(out_dir, sizes: dict[str, tuple[int, int]], layers: int, rank: int = 8, seed: int = 0):
    """A PEFT-format adapter folder with random A and B (no peft needed: for bases peft cannot load, GGUF)."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(layers):
        for part, (in_f, out_f) in sizes.items():
            group = "self_attn" if part[0] in "qkvo" else "mlp"
            key = f"base_model.model.model.layers.{layer}.{group}.{part}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, in_f, generator=g) / in_f**0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(out_f, rank, generator=g) / rank**0.5
    out_dir.mkdir(parents=True)
    save_file(tensors, str(out_dir / "adapter_model.safetensors"))
    (out_dir / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": sorted(sizes)}))
    return out_dir


def test_adapter_rows_on_a_gguf_base_fused_step_match_pytorch_forward(tmp_path, monkeypatch):
    """A quantized base: the fused step's adapter products (float32, beside the 8-bit-activation base
    products) give the PyTorch forward's logits, in a step mixing base and adapter chunks."""
    from tiny_gguf import HEADS, HIDDEN, INTERMEDIATE, LAYERS, write_tiny_gguf
    from tokenops.engine.core.batch import ChunkInput
    from tokenops.engine.core.model_runner import ModelRunner

    path = write_tiny_gguf(tmp_path / "m.gguf", "llama", "Q4_0")
    monkeypatch.setenv("TOKENOPS_QUANT_EXACT", "0")
    heads, kv_heads = HEADS["llama"]
    kv = kv_heads * HIDDEN // heads
    sizes = {"q_proj": (HIDDEN, HIDDEN), "k_proj": (HIDDEN, kv), "v_proj": (HIDDEN, kv), "o_proj": (HIDDEN, HIDDEN),
             "gate_proj": (HIDDEN, INTERMEDIATE), "up_proj": (HIDDEN, INTERMEDIATE), "down_proj": (INTERMEDIATE, HIDDEN)}
    adapter = write_random_adapter(tmp_path / "x", sizes, LAYERS)
    runners = [ModelRunner(EngineConfig(model=str(path), device="cpu", block_size=4, kv_cache_tokens=128,
                                        decode_kernel=kernel)) for kernel in ("native", "torch")]
    assert runners[0].fused_decode is not None and runners[1].fused_decode is None
    ids = [3, 17, 42, 5, 9, 33, 7]
    for r in runners:
        r.load_lora("x", str(adapter), check_base=False)
    chunks = [ChunkInput(ids, 0, list(range(2)), num_logits=len(ids), lora="x"),
              ChunkInput(ids, 0, list(range(2, 4)), num_logits=len(ids))]
    fused, torch_path = (r.execute(chunks) for r in runners)
    assert runners[0].num_fused_steps == 1 and runners[0].lora.num_fused_steps == 1
    scale = torch_path.abs().max()
    assert ((fused - torch_path).abs().max() / scale).item() < 1e-3
    n = len(ids)  # the adapter rows differ from the base rows far beyond that
    assert ((fused[:n] - fused[n:]).abs().max() / scale).item() > 1e-2
