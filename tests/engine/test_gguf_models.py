"""GGUF files run by the engine against transformers loading the same file.

Tiny random GGUFs of every supported architecture and weight type (``tiny_gguf.py``): the
engine keeps the blocks quantized and multiplies them with the quantized kernels (float32
activations here, ``TOKENOPS_QUANT_EXACT``) or dequantizes per product; transformers dequantizes
the whole file to float32 at load. Prefill logits agree to float32 rounding and greedy
decoding (chunked prefill + paged decode) gives the same tokens.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from tiny_gguf import GGUF_ARCHS, QTYPES, load_hf_gguf, write_tiny_gguf
from tokenops.engine.core.batch import ChunkInput

# every architecture in one common type, every type in the llama family (Q4_1 with a tied output,
# as the default model has it)
CASES = [(arch, "Q8_0") for arch in GGUF_ARCHS] + [("llama", q) for q in QTYPES if q != "Q8_0"]
NUM_NEW = 8


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: these models are tiny, and on a loaded 2-core box two threads wait on each
    other at every operator (a step took 40x longer in a measurement here). Float32 activations in
    the native quantized products (``TOKENOPS_QUANT_EXACT``): transformers multiplies float32 ones,
    and the comparison is to float32 rounding (``test_rounded_activations_stay_close`` checks the
    default two-byte activations)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TOKENOPS_QUANT_EXACT", "1")
        yield
    torch.set_num_threads(before)


def _prompt(n: int = 13) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(1)).tolist()


@pytest.fixture(scope="module", params=CASES, ids=[f"{a}-{q}" for a, q in CASES])
def pair(request, tmp_path_factory):
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.model_runner import ModelRunner

    arch, qtype = request.param
    folder = tmp_path_factory.mktemp(f"gguf-{arch}-{qtype}")
    path = write_tiny_gguf(folder / "model.gguf", arch, qtype, tied=qtype == "Q4_1")
    runner = ModelRunner(EngineConfig(model=str(path), device="cpu", block_size=4, kv_cache_tokens=256))
    return arch, qtype, runner, load_hf_gguf(path), path


@torch.no_grad()
def test_rounded_activations_stay_close(pair, monkeypatch):
    """The products round activations per block of 32 to one byte per value (the default, llama.cpp's
    rounding) or two: the logits stay within that rounding of the float32 ones (this random tiny model
    spreads one byte's ~7e-3 per product to a few percent of the largest logit)."""
    _, qtype, runner, _, _ = pair
    ids = _prompt()
    exact = runner.execute([ChunkInput(ids, 0, list(range(8)))])[0]
    assert runner.switches.quant_exact  # the module's TOKENOPS_QUANT_EXACT=1, read when its config was made
    errors = {}
    for num_bytes in (2, 1):
        monkeypatch.setattr(runner, "switches", replace(runner.switches, quant_exact=False, quant_act_bytes=num_bytes))
        rounded = runner.execute([ChunkInput(ids, 0, list(range(8)))])[0]
        errors[num_bytes] = (rounded - exact).abs().max().item() / exact.abs().max().item()
    assert errors[2] < 1e-3 and errors[1] < 6e-2
    if qtype in ("F32", "F16", "BF16"):  # float weights multiply in torch
        assert errors == {2: 0.0, 1: 0.0}
    else:
        assert 0 < errors[2] < errors[1]


@torch.no_grad()
def test_prefill_logits_and_greedy_decode_match_transformers(pair):
    arch, qtype, runner, hf, _ = pair
    ids = _prompt()
    ref = hf(torch.tensor([ids])).logits[0]
    table = list(range(8))
    first = runner.execute([ChunkInput(ids[:6], 0, table)])
    logits = runner.execute([ChunkInput(ids[6:], 6, table)])[0]
    scale = ref.abs().max().item()
    torch.testing.assert_close(first[0], ref[5], atol=1e-5 * max(scale, 1.0), rtol=1e-4)
    torch.testing.assert_close(logits, ref[-1], atol=1e-5 * max(scale, 1.0), rtol=1e-4)
    ours, seq = [], list(ids)
    for _ in range(NUM_NEW):
        token = int(logits.argmax())
        ours.append(token)
        seq.append(token)
        logits = runner.execute([ChunkInput([token], len(seq) - 1, table)])[0]
    hf.generation_config.eos_token_id = None
    out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                      do_sample=False, max_new_tokens=NUM_NEW, min_new_tokens=NUM_NEW, pad_token_id=0)
    assert ours == out[0, len(ids):].tolist(), (arch, qtype)


def test_weights_stay_quantized(pair):
    """Resident weights are the file's blocks (at most 1.2x the file), never float32 copies."""
    from tokenops.engine.gguf.gguf_weights import weight_bytes
    from tokenops.engine.kernels.quantized_linear import QuantizedLinear

    arch, qtype, runner, _, path = pair
    model = runner._raw_model
    assert weight_bytes(model) <= 1.2 * path.stat().st_size
    assert all(p.dim() == 1 for p in model.parameters()), "only norms and biases are float tensors"
    assert isinstance(model.lm_head, QuantizedLinear) and model.lm_head.type_names[0] == qtype
    # the fused C step cannot multiply by quantized blocks: the PyTorch forward runs, and says so
    assert runner.fused_decode is None and runner.weight_format.startswith(f"gguf {qtype}x")


@pytest.mark.parametrize("qtype", QTYPES)
def test_dequantize_matches_gguf_reference(qtype):
    import gguf
    from tokenops.engine.gguf.gguf_quants import QUANT_TYPES, dequantize

    qt = next(t for t in QUANT_TYPES.values() if t.name == qtype)
    rng = np.random.default_rng(3)
    from tiny_gguf import _encode

    raw, raw_type = _encode(rng.standard_normal((5, 512)).astype(np.float32), qtype, rng)
    raw_u8 = np.ascontiguousarray(raw).view(np.uint8).reshape(5, -1)
    ref = gguf.quants.dequantize(raw_u8, gguf.GGMLQuantizationType[qtype])
    ours = dequantize(torch.from_numpy(raw_u8.copy()), qt)
    assert torch.equal(ours, torch.from_numpy(ref.astype(np.float32))), qtype


def test_quantized_rows_of_an_embedding_are_the_dequantized_rows():
    from tiny_gguf import _encode
    from tokenops.engine.kernels.quantized_linear import QuantizedEmbedding, QuantizedWeight

    rng = np.random.default_rng(4)
    raw, raw_type = _encode(rng.standard_normal((40, 256)).astype(np.float32), "Q4_K", rng)
    weight = QuantizedWeight(torch.from_numpy(raw), int(raw_type), 256)
    ids = torch.tensor([[3, 39], [0, 3]])
    torch.testing.assert_close(QuantizedEmbedding(weight)(ids), weight.dequantize()[ids], rtol=0, atol=0)


def test_unsupported_tensor_type_is_one_line_error(tmp_path):
    """A type the engine does not implement (TQ2_0, a ternary type, here) is refused at load, naming
    tensor and type."""
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.model_runner import ModelRunner
    from tokenops.engine.models.loader import UnsupportedModelError

    write_tiny_gguf(tmp_path / "tq2.gguf", "llama", "Q8_0", tensor_types={"blk.1.ffn_up.weight": "TQ2_0"})
    with pytest.raises(UnsupportedModelError) as err:
        ModelRunner(EngineConfig(model=str(tmp_path / "tq2.gguf"), device="cpu", block_size=4, kv_cache_tokens=64))
    message = str(err.value)
    assert "blk.1.ffn_up.weight" in message and "TQ2_0" in message and "\n" not in message


def test_native_decode_kernel_runs_quantized_weights(tmp_path, monkeypatch):
    """The fused step runs GGUF weights through the quantized kernels (two-byte activations): its
    logits match the PyTorch forward's; with float32 activations asked for it declines."""
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.model_runner import ModelRunner

    path = write_tiny_gguf(tmp_path / "m.gguf", "llama", "Q4_0")
    monkeypatch.setenv("TOKENOPS_QUANT_EXACT", "0")
    runners = [ModelRunner(EngineConfig(model=str(path), device="cpu", block_size=4, kv_cache_tokens=64,
                                        decode_kernel=kernel)) for kernel in ("native", "torch")]
    assert runners[0].fused_decode is not None and runners[1].fused_decode is None
    ids = _prompt()
    fused, torch_path = (r.execute([ChunkInput(ids, 0, list(range(8)), num_logits=len(ids))]) for r in runners)
    assert runners[0].num_fused_steps == 1
    assert ((fused - torch_path).abs().max() / torch_path.abs().max()).item() < 1e-3
    monkeypatch.setenv("TOKENOPS_QUANT_EXACT", "1")
    with pytest.raises(ValueError, match="decode_kernel 'native' is unavailable: TOKENOPS_QUANT_EXACT"):
        ModelRunner(EngineConfig(model=str(path), device="cpu", block_size=4, kv_cache_tokens=64,
                                 decode_kernel="native"))


def test_unsupported_architecture_and_non_gguf_files_are_one_line_errors(tmp_path):
    import gguf
    from tokenops.config import ConfigError
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.model_runner import ModelRunner
    from tokenops.engine.models.loader import UnsupportedModelError
    from tokenops.gateway.server import model_from_arg

    w = gguf.GGUFWriter(str(tmp_path / "phi.gguf"), "mamba")  # an architecture the engine does not run
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModelError, match=r"GGUF architecture 'mamba' is not supported; supported: llama"):
        ModelRunner(EngineConfig(model=str(tmp_path / "phi.gguf"), device="cpu", block_size=4, kv_cache_tokens=64))
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(ConfigError, match="a file but not a GGUF model"):
        model_from_arg(str(tmp_path / "notes.txt"))
    assert model_from_arg(f"x={tmp_path / 'phi.gguf'}").name == "x"
    assert model_from_arg(str(tmp_path / "phi.gguf")).name == "phi"
