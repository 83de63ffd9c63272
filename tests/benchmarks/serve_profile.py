"""Where the time of ``tokenops serve`` goes: py-spy over the whole server process.

Starts ``tokenops serve`` on the 32M-parameter Llama of ``engine_throughput.py --peer
llamacpp`` (random weights, the demo tokenizer, fp32, 2 torch threads), sends either the
48 ShareGPT-shaped requests at once (``--workload load``) or one 64-token prompt decoding
256 tokens, three times (``--workload batch1``), while ``py-spy record`` (pinned below,
installed when missing) samples every thread of the server at 200 Hz. Prints the share of
samples per thread, then the functions with the largest inclusive and self shares, so
the split between the engine thread (scheduler, tensor building, forward, sampling,
output processing), the event loop (HTTP, streaming), the telemetry writer and idle
time is visible.

Run: ``.venv/bin/python tests/benchmarks/serve_profile.py --workload load`` (py-spy needs
ptrace: run as root or with ``kernel.yama.ptrace_scope = 0``).
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

PY_SPY = "py-spy==0.4.1"
RATE = 100  # samples per second and thread


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).is_file():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", PY_SPY], check=True)
        found = str(Path(sys.executable).parent / "py-spy")
    return found


def summarize(raw: Path, top: int, seconds: float) -> None:
    """Busy share of each thread (samples where it was not idle / samples taken over
    ``seconds``), then the top inclusive/self functions over all busy samples."""
    inclusive, own, threads = collections.Counter(), collections.Counter(), collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n, frames = int(count), stack.split(";")
        total += n
        threads[frames[0].split(" (")[0] + " " + frames[0].rsplit(": ", 1)[-1]] += n

        def name(frame: str) -> str:
            func, _, where = frame.partition(" (")
            return f"{func} ({where.rstrip(')').rsplit('/', 1)[-1]})" if where else func

        for key in {name(f) for f in frames[1:]}:
            inclusive[key] += n
        own[name(frames[-1])] += n
    print(f"{total} busy samples; busy share of each thread over the {seconds:.1f}s profiled:")
    for key, n in threads.most_common(8):
        print(f"  {n / (RATE * seconds):6.1%}  thread {key}")
    print("inclusive, share of busy samples (the function or anything it called):")
    for key, n in inclusive.most_common(top):
        print(f"  {n / total:6.1%}  {key}")
    print("self, share of busy samples (the function's own line was running):")
    for key, n in own.most_common(top):
        print(f"  {n / total:6.1%}  {key}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", choices=("load", "batch1"), default="load")
    ap.add_argument("--max-num-seqs", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--gguf", default=None, help="serve this GGUF (as gguf_peer.py does) instead of the 32M fp32 model")
    ap.add_argument("--native", action="store_true", help="py-spy --native: the C frames too (slower sampling)")
    args = ap.parse_args()
    import engine_throughput as et
    import llamacpp_peer as lp

    from tokenops.engine.core.tokenizer import Tokenizer
    from tokenops.testing_serve import ServeProcess

    tok = Tokenizer.from_dir(et.TOKENIZER_DIR)
    requests = et.sample_requests(tok, 48, 0, 384, 192, "clip", min_prompt=16, min_output=8)
    with tempfile.TemporaryDirectory(prefix="tokenops-profile-") as tmp:
        if args.gguf:  # the GGUF peer run's server (10,240 bfloat16 KV tokens); prompts are in range of its vocabulary
            config = (
                f'[[models]]\nname = "bench"\nbackend = "local"\npath = "{args.gguf}"\n\n[engine]\n'
                f"max_num_seqs = {args.max_num_seqs}\nkv_cache_tokens = 10240\ntorch_threads = {args.threads}\n"
                '\n[plugins.kv_policy]\ncache_dtype = "bfloat16"\n'
            )
        else:
            path = Path(tmp) / "llama-32m"
            et.build_model(path, 0, et.PEER_MODEL_CONFIG)
            config = (
                f'[[models]]\nname = "bench"\nbackend = "local"\npath = "{path}"\n\n[engine]\n'
                f"max_num_seqs = {args.max_num_seqs}\nkv_cache_tokens = 32768\ntorch_threads = {args.threads}\n"
            )
        raw = Path(tmp) / "profile.txt"
        with ServeProcess(Path(tmp) / "serve", config=config) as srv:
            lp.run_requests(srv.url, "bench", [(requests[0][0][:16], 4)] * 2)  # warm-up
            spy = subprocess.Popen(
                [
                    py_spy(),
                    "record",
                    "-p",
                    str(srv.proc.pid),
                    "-r",
                    str(RATE),
                    "--threads",
                    "-f",
                    "raw",
                    "-o",
                    str(raw),
                    "--nonblocking",
                    *(["--native"] if args.native else []),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1.0)
            start = time.perf_counter()
            if args.workload == "load":
                r = lp.run_requests(srv.url, "bench", requests)
                print(f"load: {r['tokens']} output tokens in {r['wall']:.1f}s ({r['tok_s']:.1f} tok/s)")
            else:
                r = lp.batch1_decode(srv.url, "bench", requests[0][0][:64], 256)
                print(f"batch-1 decode: {r['tok_s']:.1f} tok/s")
            seconds = time.perf_counter() - start + 1.0
            spy.send_signal(2)  # SIGINT: py-spy writes its file and exits
            spy.wait(30)
        summarize(raw, args.top, seconds)


if __name__ == "__main__":
    main()
