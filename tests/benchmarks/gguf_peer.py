"""``engine_throughput.py --peer llamacpp --gguf FILE``: tokenops serve against llama.cpp's
``llama-server`` on a real GGUF model (issue 35), same run, same requests.

For each file (the one given, and a Q8_0 made from it unless ``--skip-q8``), each server is started
on it in turn and measured:

* **throughput**: ``--requests`` (default 48) ShareGPT-shaped requests (prompts 16-384 token ids of
  the model's own tokenizer, outputs 8-192, EOS ignored, greedy) sent at once as streamed
  ``/v1/completions``: output tokens per wall second, and per CPU second of the server process
  (``/proc/PID/stat``): on a shared box the CPU figure says how much work a token cost even while
  the wall figure counts waiting for a core;
* **batch-1 decode**: 128 tokens after a 64-token prompt, best of three;
* **TTFT** of a fresh 512-token prompt (no prefix-cache hit), best of three;
* **peak RSS** of the server (``VmHWM`` of ``/proc/PID/status``, the kernel's high-water mark).

Both hold the same KV capacity (``--gguf-kv-cache-tokens``, default llama-server's 16 x 640 tokens) in
two bytes a value (``--gguf-kv-dtype``, default ``bfloat16`` against llama.cpp's float16; ``auto``
keeps tokenops' float32 cache, twice the bytes).

Then a roofline line per file: the bytes of weights one decoded token reads (every matrix of the
file once; the embedding table only as the output projection when the file ties them, else one
row), the memory bandwidth this box streams right now (a copy through torch, measured in the same
run), and their quotient, the batch-1 tok/s that reading the weights alone allows.

The Q8_0 is made with ``llama-quantize --allow-requantize`` (found next to ``llama-server``) into
``~/.cache/tokenops/gguf/`` (``$TOKENOPS_GGUF_CACHE``), once; without that tool, llama.cpp's
``convert_hf_to_gguf.py`` writes it from the float32 Hugging Face copy of the model.
llama-server runs with ``-np --parallel -t --threads`` and weight repacking off (this build
crashes with it on).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import torch

#: Per-slot context of llama-server: the longest request (384 + 192) and the 512-token TTFT prompt fit.
CTX_PER_SLOT = 640


def gguf_cache() -> Path:
    root = os.environ.get("TOKENOPS_GGUF_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tokenops", "gguf")
    return Path(root)


def q8_0_copy(src: Path, llama_server: Path) -> Path:
    """A Q8_0 version of ``src`` in :func:`gguf_cache` (written on first use)."""
    out = gguf_cache() / (src.name.replace(".Q4_1", "").removesuffix(".gguf") + ".Q8_0.gguf")
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    quantize = llama_server.parent / "llama-quantize"
    if quantize.is_file():
        r = subprocess.run([str(quantize), "--allow-requantize", str(src), str(tmp), "Q8_0"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"llama-quantize failed: {r.stderr[-2000:]}")
    else:  # the float32 Hugging Face copy of the packaged model, through llama.cpp's converter
        import sys

        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        import llamacpp_peer as lp
        from real_model import smollm2_folder

        lp.convert_to_gguf(smollm2_folder(), tmp, "q8_0")
    tmp.rename(out)
    return out


# -- what one token reads, what the box streams -------------------------------------------


@dataclass(frozen=True, slots=True)
class WeightBytes:
    """Bytes of weights one decoded token reads, and their split by GGUF type name."""

    total: int
    by_type: dict[str, int]


def weight_bytes_per_token(gguf: Path) -> WeightBytes:
    """Every matrix of the file is read once per decoded token, but the embedding table: one row of
    it when the file has its own output projection, the whole table when that projection is tied
    to it (it then serves as the output projection). Vectors (norms) are left out: kilobytes."""
    from gguf import GGMLQuantizationType

    from tokenops.engine.gguf.gguf_reader import GGUFFile

    file = GGUFFile(gguf)
    tied = not file.has_tensor("output.weight")
    by_type: dict[str, int] = {}
    for name, t in file.tensors.items():
        if len(t.shape) < 2:
            continue
        num_bytes = t.num_bytes
        if name == "token_embd.weight" and not tied:
            num_bytes //= t.shape[1]
        kind = GGMLQuantizationType(t.tensor_type).name
        by_type[kind] = by_type.get(kind, 0) + num_bytes
    file.close()
    return WeightBytes(sum(by_type.values()), by_type)


def stream_bandwidth(num_bytes: int = 256 << 20, repeats: int = 5, threads: int | None = None) -> float:
    """Bytes per second of the best of ``repeats`` copies of ``num_bytes`` (each copy reads and
    writes them: twice the bytes moved), on ``threads`` torch threads."""
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        src = torch.ones(num_bytes // 4, dtype=torch.float32)
        dst = torch.empty_like(src)
        dst.copy_(src)  # touch every page first
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(previous)
    return 2 * num_bytes / best


# -- a server process seen through /proc --------------------------------------------------


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (all its threads, and its waited-for children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # after the ")" field 3 (state) is index 0: utime 14, stime 15, cutime 16, cstime 17
    ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))
    return ticks / os.sysconf("SC_CLK_TCK")


def proc_status_kib(pid: int, key: str) -> int:
    """A ``kB`` line of ``/proc/PID/status`` (``VmHWM``: peak resident set; ``VmRSS``: current)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


@dataclass(slots=True)
class ServerFigures:
    """One server's figures on one file."""

    tok_s: float = 0.0
    tok_cpu_s: float = 0.0  # output tokens per CPU second of the server during the load
    wall_s: float = 0.0
    ttft_median_s: float = 0.0
    b1_tok_s: float = 0.0
    b1_tok_cpu_s: float = 0.0
    ttft512_s: float = 0.0
    ttft512_cpu_s: float = 0.0
    peak_rss_mb: float = 0.0


def measure(make: Callable[[], AbstractContextManager], requests: list[tuple[list[int], int]],
            b1_prompt: list[int], b1_tokens: int, ttft_prompt: list[int], repeats: int) -> ServerFigures:
    """Start a server with ``make()``, run the three workloads on it, read its peak RSS, stop it."""
    import llamacpp_peer as lp

    fig = ServerFigures()
    with make() as srv:
        pid = srv.proc.pid
        lp.run_requests(srv.url, "bench", [(requests[0][0][:16], 4)] * 2)  # warm-up
        cpu0 = proc_cpu_seconds(pid)
        r = lp.run_requests(srv.url, "bench", requests)
        fig.tok_cpu_s = r["tokens"] / max(proc_cpu_seconds(pid) - cpu0, 1e-9)
        fig.tok_s, fig.wall_s, fig.ttft_median_s = r["tok_s"], r["wall"], r["ttft_median"]
        for k in range(repeats):
            ids = shifted(b1_prompt, k + 1)  # another prompt each time: no prefix-cache hit
            cpu0 = proc_cpu_seconds(pid)
            one = lp.run_requests(srv.url, "bench", [(ids, b1_tokens)])
            cpu = proc_cpu_seconds(pid) - cpu0
            rate = (one["tokens"] - 1) / max(one["wall"] - one["ttft_median"], 1e-9)
            if rate > fig.b1_tok_s:
                fig.b1_tok_s, fig.b1_tok_cpu_s = rate, one["tokens"] / max(cpu, 1e-9)
        fig.ttft512_s = float("inf")
        for k in range(repeats):
            cpu0 = proc_cpu_seconds(pid)
            one = lp.run_requests(srv.url, "bench", [(shifted(ttft_prompt, 100 + k), 1)])
            if one["ttft_median"] < fig.ttft512_s:
                fig.ttft512_s, fig.ttft512_cpu_s = one["ttft_median"], proc_cpu_seconds(pid) - cpu0
        fig.peak_rss_mb = proc_status_kib(pid, "VmHWM") / 1024
    return fig


def shifted(ids: list[int], k: int, vocab: int = 8000) -> list[int]:
    """``ids`` moved to other token ids (the same length), so no server finds the prompt cached."""
    return [(t + 7 * k) % vocab + 10 for t in ids]


def filled(ids: list[int], n: int) -> list[int]:
    """``ids`` repeated or cut to exactly ``n`` tokens."""
    return (ids * (n // max(len(ids), 1) + 1))[:n]


# -- the run ------------------------------------------------------------------------------


def tokenops_config(gguf: Path, args) -> str:
    return (f'[[models]]\nname = "bench"\nbackend = "local"\npath = "{gguf}"\n\n[engine]\n'
            f"max_num_seqs = {args.concurrency}\nmax_num_batched_tokens = {args.budget}\n"
            f"kv_cache_tokens = {args.gguf_kv_cache_tokens}\ntorch_threads = {args.threads}\n"
            f'\n[plugins.kv_policy]\ncache_dtype = "{args.gguf_kv_dtype}"\n')


def print_row(name: str, f: ServerFigures, num_tokens: int) -> None:
    print(f"{name:<26} {f.tok_s:7.1f} output tok/s ({f.tok_cpu_s:6.1f} per server CPU-s; {num_tokens} tokens in "
          f"{f.wall_s:.1f}s, TTFT median {f.ttft_median_s * 1000:.0f} ms) | batch-1 {f.b1_tok_s:6.1f} tok/s "
          f"({f.b1_tok_cpu_s:6.1f} per CPU-s) | TTFT 512 {f.ttft512_s * 1000:6.0f} ms "
          f"({f.ttft512_cpu_s * 1000:.0f} ms CPU) | peak RSS {f.peak_rss_mb:6.0f} MB", flush=True)


def print_ratios(label: str, ours: ServerFigures, peer: ServerFigures) -> None:
    def ratio(a: float, b: float) -> str:
        return f"{a / max(b, 1e-9):.2f}x"

    print(f"ratio tokenops / llama.cpp, {label}: throughput {ratio(ours.tok_s, peer.tok_s)} "
          f"(CPU {ratio(ours.tok_cpu_s, peer.tok_cpu_s)}; goal >= 1.5x), batch-1 decode "
          f"{ratio(ours.b1_tok_s, peer.b1_tok_s)} (CPU {ratio(ours.b1_tok_cpu_s, peer.b1_tok_cpu_s)}; goal >= 1.0x), "
          f"TTFT 512 {ratio(ours.ttft512_s, peer.ttft512_s)} (CPU {ratio(ours.ttft512_cpu_s, peer.ttft512_cpu_s)}; "
          f"goal <= 1.0x), peak RSS {ours.peak_rss_mb - peer.peak_rss_mb:+.0f} MB (goal <= +300 MB)", flush=True)


def run_gguf(args, sample_requests: Callable) -> None:
    """Both servers on ``args.gguf`` and its Q8_0 copy; rows, ratios and the roofline printed."""
    import tempfile

    import llamacpp_peer as lp
    from tokenops.engine.gguf.gguf_reader import GGUFFile
    from tokenops.engine.gguf.gguf_tokenizer import gguf_tokenizer
    from tokenops.testing_serve import ServeProcess

    server_bin = lp.llama_server()
    source = Path(args.gguf).resolve()
    files = {source.name: source}
    if not args.skip_q8:
        q8 = q8_0_copy(source, server_bin)
        files[q8.name] = q8
    file = GGUFFile(source)
    tok = gguf_tokenizer(file)
    file.close()
    max_prompt, max_output = (128, 32) if args.quick else (384, 192)
    requests = sample_requests(tok, args.requests, args.seed, max_prompt, max_output, "clip",
                               min_prompt=16, min_output=8)
    pool = [t for ids, _ in requests for t in ids]
    b1_prompt, ttft_prompt = filled(pool, 64), filled(pool[::-1], 512)
    b1_tokens, repeats = (32, 1) if args.quick else (128, 3)
    prompt_lens, out_lens = [len(i) for i, _ in requests], [n for _, n in requests]
    print(f"GGUF peer run: {', '.join(files)}; {args.threads} threads per server, {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.1f}; llama-server {server_bin} (-np {args.parallel}, -c {CTX_PER_SLOT} per slot, "
          f"--no-repack, float16 KV); tokenops max_num_seqs {args.concurrency}, kv_cache_tokens "
          f"{args.gguf_kv_cache_tokens}, KV {args.gguf_kv_dtype}")
    print(f"workload: {len(requests)} ShareGPT requests at once (seed {args.seed}): prompt tokens mean "
          f"{statistics.mean(prompt_lens):.0f} [{min(prompt_lens)}, {max(prompt_lens)}], output tokens mean "
          f"{statistics.mean(out_lens):.0f} [{min(out_lens)}, {max(out_lens)}], EOS ignored, greedy; batch-1: "
          f"{b1_tokens} tokens after 64, best of {repeats}; TTFT of a fresh 512-token prompt, best of {repeats}",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="tokenops-gguf-peer-") as tmp:
        for label, gguf in files.items():
            make_tokenops = lambda gguf=gguf, label=label: ServeProcess(  # noqa: E731
                Path(tmp) / label, config=tokenops_config(gguf, args), store=not args.no_store)
            make_llama = lambda gguf=gguf: lp.LlamaServer(  # noqa: E731
                gguf, args.parallel, args.threads, CTX_PER_SLOT, repack=False)
            figures = {}
            for name, make in (("tokenops serve", make_tokenops), ("llama.cpp server", make_llama)):
                if args.gguf_only and not name.startswith(args.gguf_only[:5]):
                    continue
                figures[name] = measure(make, requests, b1_prompt, b1_tokens, ttft_prompt, repeats)
                print_row(f"{name} {label.split('.')[-2]}", figures[name], sum(out_lens))
            if len(figures) == 2:
                print_ratios(label.split(".")[-2], figures["tokenops serve"], figures["llama.cpp server"])
            weights = weight_bytes_per_token(gguf)
            bandwidth = stream_bandwidth(threads=args.threads)
            split = ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sorted(weights.by_type.items()))
            print(f"roofline {label.split('.')[-2]}: {weights.total / 1e6:.1f} MB of weights per decoded token "
                  f"({split}); stream copy {bandwidth / 1e9:.1f} GB/s on {args.threads} threads now -> ceiling "
                  f"{bandwidth / weights.total:.0f} tok/s at batch 1 ("
                  + ", ".join(f"{name.split()[0]} reached {f.b1_tok_s / (bandwidth / weights.total):.0%}"
                              for name, f in figures.items()) + ")", flush=True)

