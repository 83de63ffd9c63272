"""The fused decode step (tokenops.engine.kernels.fused_decode) against the PyTorch forward."""

from __future__ import annotations

import pytest
import torch
from fused_checks import fused_and_reference, mixed_prefills, serve_and_generate

from tests.serve_configs import config as serve_config, local_model, section
from tokenops.engine.kernels import fused_decode, panels
from tokenops.engine.core.batch import ChunkInput
from tokenops.engine.core.config import EngineConfig
from tokenops.engine.core.engine import LLMEngine
from tokenops.engine.sampling.sampling import SamplingParams

needs_lib = pytest.mark.skipif(fused_decode._library() is None, reason="no C compiler: decodes use the PyTorch path")
DENSE = ("llama", "qwen2", "qwen2_sliding", "qwen3", "qwen3_hd128", "mistral", "mistral_h12", "phi3", "gemma", "gemma2", "gemma3")


def _prefill(runner, prompts, tables):
    runner.execute([ChunkInput(p, 0, t) for p, t in zip(prompts, tables)])


def _decode_both(runner, chunks):
    """Logits of the same decode step through the fused call and through the PyTorch forward
    (which rewrites the same K/V slots with the same values)."""
    fused, reference, _ = fused_and_reference(runner, chunks)
    return fused, reference


@needs_lib
@pytest.mark.parametrize("arch", DENSE)
def test_fused_step_matches_pytorch_forward(arch, tiny_checkpoint, make_runner):
    # the reference multiplies with F.linear (under "auto" its linear layers would share the fused products)
    runner = make_runner(tiny_checkpoint(arch), decode_kernel="native", block_size=4, kv_cache_tokens=512,
                         weight_layout="plain")
    assert runner.fused_decode is not None and runner.weight_layout == "plain"
    g = torch.Generator().manual_seed(0)
    vocab = runner.vocab_size
    # 70 tokens: the context is split between threads, and crosses qwen2_sliding's window
    lengths = (70, 9, 5, 12, 33, 8, 21)
    prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]
    tables, start = [], 0
    for n in lengths:
        tables.append(list(range(start, start + n // 4 + 1)))
        start += n // 4 + 1
    _prefill(runner, prompts, tables)
    # one row, two, the order kept, and 7 rows (products over 4 + 2 + 1 inputs per weight row)
    for rows in ([0], [0, 1], [1, 0], [3, 1, 0, 2, 6, 4, 5]):
        chunks = [ChunkInput([int(torch.randint(0, vocab, (1,), generator=g))], lengths[i], tables[i]) for i in rows]
        fused, reference = _decode_both(runner, chunks)
        assert fused.shape == reference.shape == (len(rows), vocab)
        torch.testing.assert_close(fused, reference, atol=2e-4, rtol=1e-4)


@needs_lib
@pytest.mark.parametrize("arch", ["qwen2_sliding", "mistral_h12", "gemma2", "gemma3"])
def test_fused_step_runs_verify_chunks_causally(arch, tiny_checkpoint, make_runner):
    """Speculative decoding's verify chunks (k + 1 tokens, logits for each) are rows of the fused
    step; each attends to the chunk's earlier tokens only (and within the sliding window), as in
    the PyTorch forward. mistral_h12 has 12 heads on 3 KV heads (heads scored 8 to a vector plus 4
    alone; a chunk's value pass takes 3 + 1 heads per KV head); Gemma 2/3's windows are 5 tokens on
    layer 0 (with Gemma 2's soft-capped scores, Gemma 3's local rotary table)."""
    runner = make_runner(tiny_checkpoint(arch), decode_kernel="native", block_size=4, kv_cache_tokens=512,
                         weight_layout="plain")
    prompts, tables = [list(range(3, 40)), list(range(50, 61))], [list(range(0, 12)), list(range(20, 26))]
    _prefill(runner, prompts, tables)
    chunks = [ChunkInput([7, 8, 9, 10], 37, tables[0], num_logits=4), ChunkInput([11], 11, tables[1])]
    assert runner.fused_decode.accepts(chunks)
    fused, reference = _decode_both(runner, chunks)
    assert fused.shape == (5, runner.vocab_size)
    torch.testing.assert_close(fused, reference, atol=2e-4, rtol=1e-4)
    # a short chunk that wants only its last row (a draft catching up), next to a decode
    chunks = [ChunkInput([7, 8, 5], 41, tables[0]), ChunkInput([12], 12, tables[1])]
    fused, reference = _decode_both(runner, chunks)
    assert fused.shape == (2, runner.vocab_size)
    torch.testing.assert_close(fused, reference, atol=2e-4, rtol=1e-4)


@needs_lib
@pytest.mark.parametrize("arch", ["llama", "qwen2_sliding", "mistral_h12", "gemma2", "gemma3"])
@pytest.mark.parametrize("threads", [1, 3])
def test_prefill_chunks_take_the_fused_step(arch, threads, tiny_checkpoint, make_runner):
    """Prefill chunks are rows of the fused step too: the same logits (only the last row of each
    chunk, or the last num_logits) and the same K/V as the PyTorch forward, for chunks attended by
    rows split between the threads (over 16 tokens, in blocks of 64 rows), a prefill continuing a
    cached prefix, next to decodes and a verify chunk, across qwen2_sliding's window; a step over
    max_rows tokens keeps the PyTorch forward."""
    runner = make_runner(tiny_checkpoint(arch), decode_kernel="native", block_size=4, kv_cache_tokens=1024,
                         weight_layout="plain")
    vocab = runner.vocab_size
    prompts, tables = mixed_prefills(vocab, seed=3)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        steps = [[ChunkInput(p, 0, t) for p, t in zip(prompts, tables)],
                 # a prefill after a cached prefix, a decode, a verify chunk, a chunk that wants 3 rows
                 [ChunkInput(prompts[0][:40], 70, tables[0]), ChunkInput([5], 9, tables[1]),
                  ChunkInput([6, 7, 8, 9], 130, tables[2], num_logits=4),
                  ChunkInput(prompts[1] * 3, 17, tables[3], num_logits=3)]]
        for chunks in steps:
            assert runner.fused_decode.accepts(chunks)
            fused, reference, cache = fused_and_reference(runner, chunks)
            assert fused.shape == reference.shape == (sum(c.num_logits for c in chunks), vocab)
            torch.testing.assert_close(fused, reference, atol=3e-4, rtol=1e-4)
            torch.testing.assert_close(cache, runner.kv_cache, atol=1e-4, rtol=1e-4)
    finally:
        torch.set_num_threads(saved)
    runner.fused_decode.max_rows = 64
    assert not runner.fused_decode.accepts([ChunkInput(prompts[0], 0, tables[0])])


@needs_lib
@pytest.mark.parametrize("arch", ["qwen2", "qwen3_hd128"])
def test_large_decode_batches_and_verify_chunks_in_one_fused_step(arch, tiny_checkpoint, make_runner):
    """Decode steps of any size (here 29 rows: 25 decodes and a 4-token verify chunk) take the
    fused call."""
    runner = make_runner(tiny_checkpoint(arch), decode_kernel="native", block_size=4, kv_cache_tokens=1024,
                         weight_layout="plain")
    g = torch.Generator().manual_seed(1)
    vocab = runner.vocab_size
    lengths = [int(n) for n in torch.randint(3, 30, (26,), generator=g)]
    prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]
    tables, start = [], 0
    for n in lengths:
        tables.append(list(range(start, start + n // 4 + 3)))
        start += n // 4 + 3
    _prefill(runner, prompts, tables)
    chunks = [ChunkInput([int(torch.randint(0, vocab, (1,), generator=g))], lengths[i], tables[i]) for i in range(25)]
    chunks.append(ChunkInput([3, 4, 5, 6], lengths[25], tables[25], num_logits=4))
    assert runner.fused_decode.accepts(chunks)
    fused, reference = _decode_both(runner, chunks)
    assert fused.shape == (29, vocab)
    torch.testing.assert_close(fused, reference, atol=2e-4, rtol=1e-4)


@needs_lib
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_panel_products_match_a_matmul_at_every_shape(bias, dtype):
    """The C products over 16-wide panels: every tile shape (1-8 rows and more; 4 rows run as two
    tiles of 2), output widths that leave a partial last panel, odd input widths, with and without
    a bias; bfloat16 panels give the product with the weights rounded to bfloat16."""
    g = torch.Generator().manual_seed(2)
    for n, k in ((1, 1), (15, 7), (16, 64), (17, 33), (40, 100), (96, 3), (200, 24)):
        weight = torch.randn(n, k, generator=g)
        b = torch.randn(n, generator=g) if bias else None
        arena = torch.empty(panels._panelled_size(weight), dtype=panels.PANEL_DTYPES[dtype])
        panels._pack_panels(weight, arena)
        panel = panels.PanelWeight(_ArenaOwner(arena, dtype), arena.data_ptr(), n, k)
        reference = weight.to(arena.dtype).float()
        if dtype == "bfloat16":
            assert not torch.equal(reference, weight)
        for m in (1, 2, 3, 4, 5, 6, 7, 8, 13):
            x = torch.randn(2, m, k, generator=g)  # any leading shape
            got = panel(x, b)
            assert got.shape == (2, m, n)
            torch.testing.assert_close(got, torch.nn.functional.linear(x, reference, b), atol=1e-4, rtol=1e-4)
            # a row's result does not depend on the rows beside it
            torch.testing.assert_close(panel(x[:, :1], b), got[:, :1], atol=0, rtol=0)
    assert panel(torch.empty(0, 24), None).shape == (0, 200)


class _ArenaOwner:
    """Stands in for a FusedDecoder: keeps the arena alive and exposes the library's product."""

    def __init__(self, arena, dtype="float32"):
        self.arena = arena
        self._linear_fn = fused_decode._library(dtype).linear_panels


@needs_lib
def test_panels_layout_holds_the_linear_weights_once(tiny_checkpoint, make_runner):
    """Under "auto" the PyTorch forward's linear layers multiply through the fused step's panels and
    their dense weights are released (a tied lm_head keeps its tensor: the embedding is the same
    one); logits of the PyTorch forward (a step over the fused step's max_rows) agree with F.linear;
    "panels" without the fused step is an error."""
    for arch in ("llama", "qwen2"):
        path = tiny_checkpoint(arch)
        runner = make_runner(path)
        assert runner.fused_decode is not None and runner.weight_layout == "panels"
        model = runner._raw_model
        linears = [m for m in model.modules() if type(m).__name__ == "Linear"]
        assert linears and all(m.panel is not None for m in linears)
        tied = model.lm_head.weight is model.model.embed_tokens.weight
        assert tied == (arch == "qwen2")
        assert all(m.weight.numel() == 0 for m in linears if not (tied and m is model.lm_head))
        plain = make_runner(path, weight_layout="plain", decode_kernel="torch")
        prompt = [ChunkInput(list(range(5, 45)), 0, list(range(0, 11))), ChunkInput([7, 8, 9], 0, [11, 12])]
        runner.fused_decode.max_rows = 0  # the PyTorch forward (a step over max_rows), through the panels
        torch.testing.assert_close(runner.execute(prompt), plain.execute(prompt), atol=2e-4, rtol=1e-4)
        assert runner.num_fused_steps == 0
        # the CPU KV cache sits in 2 MiB-aligned memory advised onto huge pages
        assert runner.kv_cache.data_ptr() % (2 << 20) == 0 and plain.kv_cache.data_ptr() % (2 << 20) == 0
    with pytest.raises(ValueError, match="weight_layout 'panels' is unavailable: it needs the fused decode step"):
        make_runner(tiny_checkpoint("llama"), decode_kernel="torch", weight_layout="panels")
    with pytest.raises(ValueError, match="weight_layout must be 'auto', 'panels', 'onednn' or 'plain'"):
        EngineConfig(model=str(tiny_checkpoint("llama")), weight_layout="blocked")


@needs_lib
def test_bfloat16_panels_run_the_model_with_rounded_weights(tiny_checkpoint, make_runner):
    """panel_dtype = "bfloat16": the fused step (decodes and a verify chunk) and, under "auto", the
    prefill's linear layers compute the model whose linear weights are rounded to bfloat16."""
    path = tiny_checkpoint("qwen3")
    runner = make_runner(path, decode_kernel="native", panel_dtype="bfloat16", block_size=4, kv_cache_tokens=512,
                         weight_layout="plain")
    assert runner.fused_decode.panel_dtype == "bfloat16" and runner.fused_decode.arena.dtype == torch.bfloat16
    with torch.no_grad():  # the PyTorch forward's (plain) weights rounded the same way: the reference
        for m in runner._raw_model.modules():
            if type(m).__name__ == "Linear":
                m.weight.copy_(m.weight.to(torch.bfloat16).float())
    prompts, tables = [list(range(3, 40)), list(range(50, 61))], [list(range(0, 12)), list(range(20, 26))]
    _prefill(runner, prompts, tables)
    chunks = [ChunkInput([7, 8, 9, 10], 37, tables[0], num_logits=4), ChunkInput([11], 11, tables[1])]
    fused, reference = _decode_both(runner, chunks)
    torch.testing.assert_close(fused, reference, atol=2e-4, rtol=1e-4)
    auto = make_runner(path, panel_dtype="bfloat16", block_size=4, kv_cache_tokens=512)
    assert auto.weight_layout == "panels"
    prompt = [ChunkInput(list(range(5, 45)), 0, list(range(0, 11)))]
    torch.testing.assert_close(auto.execute(prompt), runner.execute(prompt), atol=2e-4, rtol=1e-4)
    fp32 = make_runner(path, block_size=4, kv_cache_tokens=512)
    assert not torch.allclose(fp32.execute(prompt), auto.execute(prompt), atol=1e-4)
    with pytest.raises(ValueError, match="engine panel_dtype must be 'float32' or 'bfloat16', not 'float16'"):
        EngineConfig(model=str(path), panel_dtype="float16")
    with pytest.raises(ValueError, match="panel_dtype 'bfloat16' is unavailable: it is the fused decode step's"):
        make_runner(path, decode_kernel="torch", panel_dtype="bfloat16")


def _draft_token_by_token(decoder, chunks, want, min_confidence):
    """What the draft proposer did before drafting went native: one fused call per token,
    argmax of each chunk's last row fed back, a stop under ``min_confidence``."""
    tokens, steps, live = [[] for _ in chunks], [0] * len(chunks), list(range(len(chunks)))
    cur = list(chunks)
    while live:
        logits = decoder([cur[i] for i in live])
        ends = torch.tensor([len(cur[i].token_ids) for i in live]).cumsum(0) - 1
        rows = logits[ends] if logits.shape[0] != len(live) else logits
        still = []
        for row, i in zip(rows, live):
            steps[i] += 1
            best = int(row.argmax())
            if min_confidence and float(row.softmax(-1)[best]) < min_confidence:
                continue
            tokens[i].append(best)
            if len(tokens[i]) < want[i]:
                cur[i] = ChunkInput([best], cur[i].end_pos, cur[i].block_table)
                still.append(i)
        live = still
    return tokens, steps


@needs_lib
@pytest.mark.parametrize("arch", ["qwen2_sliding", "gemma2"])
def test_greedy_drafting_in_one_call_matches_token_by_token(arch, tiny_checkpoint, make_runner):
    """A draft model's proposals in one native call (speculative decoding's draft steps) are the
    tokens, and the steps, of one fused call per token: chunks of 1-3 tokens (a catch-up after an
    accepted round), each with its own count, across block boundaries, with and without the
    confidence stop (Gemma 2: its probabilities from the soft-capped logits)."""
    runner = make_runner(tiny_checkpoint(arch), decode_kernel="native", block_size=4, kv_cache_tokens=512)
    decoder = runner.fused_decode
    prompts = [list(range(3, 40)), list(range(50, 61)), list(range(70, 79))]
    tables = [list(range(0, 12)), list(range(20, 26)), list(range(30, 36))]
    _prefill(runner, prompts, tables)
    chunks = [ChunkInput([7, 8], 37, tables[0]), ChunkInput([11], 11, tables[1]), ChunkInput([12, 13, 14], 9, tables[2])]
    want = [6, 1, 4]
    drafted, steps = decoder.draft_greedy(chunks, want)
    assert [len(t) for t in drafted] == want and steps == want
    assert (drafted, steps) == _draft_token_by_token(decoder, chunks, want, 0.0)
    # a confidence bar between the probabilities of the drafted tokens stops some chunks early
    probs = []
    for chunk, toks in zip(chunks, drafted):
        seq = chunk.token_ids + toks
        logits = runner.execute([ChunkInput(seq[:-1], chunk.start_pos, chunk.block_table, num_logits=len(toks))])
        probs += [float(p) for p in logits.softmax(-1).gather(1, torch.tensor(toks)[:, None]).flatten()]
    bar = sorted(probs)[len(probs) // 2]
    bar = (bar + max(p for p in probs if p < bar)) / 2
    stopped, stopped_steps = decoder.draft_greedy(chunks, want, bar)
    assert (stopped, stopped_steps) == _draft_token_by_token(decoder, chunks, want, bar)
    assert sum(map(len, stopped)) < sum(want) and stopped_steps != steps
    with pytest.raises(ValueError, match="cannot hold"):
        decoder.draft_greedy([ChunkInput([11], 11, tables[1][:3])], [3])


@needs_lib
def test_fused_step_skips_evicted_blocks(tiny_llama_dir, make_runner):
    runner = make_runner(tiny_llama_dir, decode_kernel="native", block_size=4, kv_cache_tokens=512)
    prompt = list(range(3, 43))
    table = list(range(10, 21))
    _prefill(runner, [prompt], [table])
    evicted = table.copy()
    evicted[2] = evicted[3] = -1  # blocks a sink + window policy dropped
    chunk = [ChunkInput([7], 40, evicted)]
    fused, reference = _decode_both(runner, chunk)
    torch.testing.assert_close(fused, reference, atol=2e-4, rtol=1e-4)
    full, _ = _decode_both(runner, [ChunkInput([7], 40, table)])
    assert not torch.allclose(full, fused, atol=1e-3)  # the evicted positions really were left out


@needs_lib
@pytest.mark.parametrize("arch", ["llama", "gemma2", "gemma3"])
@pytest.mark.parametrize("threads", [1, 2])
def test_engine_output_identical_with_and_without_the_fused_step(arch, threads, tiny_llama_dir, tiny_checkpoint):
    """Greedy tokens and logprobs of the engine, fused step or PyTorch forward, batch of one or three
    (Gemma 2: soft caps and a 5-token window crossed; Gemma 3: q/k norms and two rotary tables)."""
    model = tiny_llama_dir if arch == "llama" else tiny_checkpoint(arch)
    torch_threads = torch.get_num_threads()
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2)
    prompts = [[5, 6, 7, 8, 9], [11, 12, 13], list(range(20, 60))]
    outs, engines = {}, {}
    try:
        for kernel in ("torch", "native"):
            engine = LLMEngine(EngineConfig(model=str(model), device="cpu", decode_kernel=kernel,
                                            torch_threads=threads, kv_cache_tokens=1024))
            # one at a time (fused, one row), three together (fused, three rows), and with max_rows
            # lowered, three on the PyTorch path
            outs[kernel] = [engine.generate([p], params)[0] for p in prompts] + engine.generate(prompts, params)
            if engine.runner.fused_decode is not None:
                engine.runner.fused_decode.max_rows = 2
            outs[kernel] += engine.generate(prompts, params)
            engines[kernel] = engine
    finally:
        torch.set_num_threads(torch_threads)
    assert "fused_decode_steps" not in engines["torch"].stats()
    assert engines["native"].stats()["fused_decode_steps"] >= 4 * 23  # + the short prompts' prefills
    for a, b in zip(outs["torch"], outs["native"]):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
            assert x["logprob"] == pytest.approx(y["logprob"], abs=1e-4)


@needs_lib
@pytest.mark.parametrize("arch", ["gemma2_gguf", "gemma3_gguf"])
def test_fused_step_runs_quantized_gemma_files(arch, tiny_checkpoint, tmp_path, make_runner):
    """A Gemma 2/3 GGUF (Q8_0, written as llama.cpp's converter writes it: norms stored as 1 + w) takes
    the fused step with its products from the file's blocks (Gemma 3: five local layers, one global):
    the same logits as the PyTorch forward through the same quantized products, decodes and a verify
    chunk past the 5-token windows."""
    from tiny_gguf_hf import write_gguf_from_hf

    path = write_gguf_from_hf(tiny_checkpoint(arch), tmp_path / f"{arch}.gguf", "Q8_0")
    runner = make_runner(path, decode_kernel="native", kv_cache_tokens=256)
    assert runner.fused_decode.panel_dtype == "gguf"
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, runner.vocab_size, (n,), generator=g).tolist() for n in (23, 9)]
    tables = [list(range(0, 10)), list(range(10, 16))]
    _prefill(runner, prompts, tables)
    for chunks in ([ChunkInput([5], 23, tables[0])],
                   [ChunkInput([6], 9, tables[1]), ChunkInput([7, 8, 9], 24, tables[0], num_logits=3)]):
        fused, reference = _decode_both(runner, chunks)
        assert fused.shape == reference.shape == (sum(c.num_logits for c in chunks), runner.vocab_size)
        torch.testing.assert_close(fused, reference, atol=2e-3, rtol=1e-3)
        assert fused.argmax(-1).tolist() == reference.argmax(-1).tolist()


@needs_lib
def test_gemma_adapter_rows_on_the_fused_step_match_the_pytorch_forward(tiny_checkpoint, tmp_path):
    """LoRA rows on a Gemma 3 base (adapters on every projection): the fused step adds o_proj's and
    down_proj's products before the sandwich norms, as the PyTorch forward's hooks do; a batch mixing
    adapter and base rows gives the same greedy tokens either way."""
    pytest.importorskip("peft")
    from test_lora import ALL, make_adapter

    base = tiny_checkpoint("gemma3")
    adapter = make_adapter(base, tmp_path / "a", 8, 16, ALL, False, 1)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [11, 12, 13]]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outs, engines = {}, {}
    for kernel in ("torch", "native"):
        engine = LLMEngine(EngineConfig(model=str(base), device="cpu", decode_kernel=kernel, torch_threads=1,
                                        kv_cache_tokens=512))
        engine.load_lora("a", str(adapter))
        got = engine.generate(prompts * 2, params, loras=["a", "a", None, None])
        outs[kernel] = [o.outputs[0].token_ids for o in got]
        engines[kernel] = engine
    assert engines["native"].stats()["lora"]["fused_steps"] > 0
    assert outs["native"] == outs["torch"]
    assert outs["torch"][:2] != outs["torch"][2:]  # the adapter changes the tokens


def test_auto_declines_and_native_refuses_what_it_cannot_run(tiny_checkpoint, make_runner):
    moe = tiny_checkpoint("mixtral")
    assert make_runner(moe).fused_decode is None
    with pytest.raises(ValueError, match="decode_kernel 'native' is unavailable: the model has mixture-of-experts"):
        make_runner(moe, decode_kernel="native")
    llama = tiny_checkpoint("llama")
    assert make_runner(llama, kv_cache_dtype="int8").fused_decode is None
    from tokenops_plugins.model_optimization._quant_layers import quantize_model  # int8 weights: a transform

    runner = make_runner(llama, decode_kernel="torch")
    assert quantize_model(runner._raw_model, "int8") > 0
    assert "weight transform replaced a linear layer (Int8Linear)" in fused_decode.ineligible_reason(
        runner._raw_model, runner.kv_cache, runner.device)
    assert make_runner(llama, dtype="bfloat16").fused_decode is None
    assert make_runner(llama, decode_kernel="torch").fused_decode is None
    with pytest.raises(ValueError, match="float32 or bfloat16 KV cache"):
        make_runner(llama, kv_cache_dtype="int8", decode_kernel="native")
    with pytest.raises(ValueError, match="decode_kernel must be 'auto', 'native' or 'torch'"):
        EngineConfig(model=str(llama), decode_kernel="fast")


def test_auto_declines_a_large_weight_copy(tiny_llama_dir, make_runner, monkeypatch):
    monkeypatch.setattr(fused_decode, "AUTO_MAX_EXTRA_BYTES", 1024)
    assert make_runner(tiny_llama_dir).fused_decode is None
    if fused_decode._library() is not None:
        assert make_runner(tiny_llama_dir, decode_kernel="native").fused_decode is not None


PROMPT_40 = [(7 * i) % 50 + 5 for i in range(40)]


@needs_lib
@pytest.mark.parametrize(("arch", "panel_dtype"), [("llama", None), ("llama", "bfloat16"), ("gemma3", None)])
def test_serve_decodes_through_the_fused_step(tmp_path, tiny_llama_dir, tiny_checkpoint, arch, panel_dtype):
    """A default ``tokenops serve`` streams a lone request through the fused step, every step of it
    (a 40-token prompt: a prefill whose attention is split by rows), and answers exactly what the
    PyTorch forward generates (a Gemma 3 too); with ``[engine] panel_dtype = "bfloat16"`` what the
    engine with bfloat16 panels generates."""
    model = tiny_llama_dir if arch == "llama" else tiny_checkpoint(arch)
    config = local_model("tiny", model)
    if panel_dtype:
        config = serve_config(config, section("engine", panel_dtype=panel_dtype))
    if panel_dtype:  # the same engine in process: the rounded weights, through the fused step
        reference_config = EngineConfig(model=str(model), device="cpu", panel_dtype=panel_dtype)
    else:
        reference_config = EngineConfig(model=str(model), device="cpu", decode_kernel="torch")
    text, stats, reference = serve_and_generate(tmp_path, config, PROMPT_40, reference_config)
    engines = [e for e in stats["engines"].values() if "fused_decode_steps" in e]
    assert engines and engines[0]["fused_decode_steps"] == engines[0]["num_steps"] >= 16, stats["engines"]
    assert engines[0]["panel_dtype"] == (panel_dtype or "float32")
    assert text == reference
