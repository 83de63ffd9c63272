"""`tokenops bench` against GuideLLM (an independent load generator) on the same
server and workload: throughput and median TTFT should agree within 10%.

GuideLLM is installed by this script into its own venv under /tmp (pip), never
into the project's environment. The default target is the test suite's fake
OpenAI-compatible server (deterministic step delays, prompt length free of
cost, so both tools' different prompt texts load it identically); --url points
both tools at any other server instead (e.g. `tokenops serve`).

Run: .venv/bin/python tests/benchmarks/bench_vs_guidellm.py [--concurrency 8] [--requests 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV = Path("/tmp/tokenops-guidellm-venv")
def _tokenizer_dir() -> Path:
    """A folder with the bundled demo model's tokenizer.json, for GuideLLM's synthetic prompts."""
    for p in sorted((ROOT / "tokenops" / "demo_models").glob("*/tokenizer.json")):
        return p.parent
    raise FileNotFoundError("no demo model tokenizer under tokenops/demo_models")


def ensure_guidellm(venv: Path) -> tuple[Path | None, str]:
    exe = venv / "bin" / "guidellm"
    if exe.is_file():
        return exe, "already installed"
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
        r = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "guidellm"], capture_output=True, text=True,
                           timeout=1800)
    except (subprocess.SubprocessError, OSError) as e:
        return None, f"could not create the venv: {e}"
    if r.returncode != 0 or not exe.is_file():
        return None, "pip could not install guidellm: " + (r.stderr.strip().splitlines() or ["?"])[-1]
    return exe, "installed now"


def run_tokenops(url: str, concurrency: int, num: int, input_len: int, output_len: int) -> dict:
    from tokenops.bench.runner import BenchPlan, run_plan

    plan = BenchPlan(url=url, workload="synthetic", num_requests=num, concurrencies=[concurrency], ignore_eos=True,
                     workload_options={"input_len": input_len, "output_len": output_len})
    s = asyncio.run(run_plan(plan)).levels[0].summary
    return {"requests_per_s": s.request_rate, "output_tokens_per_s": s.output_tps,
            "ttft_median_ms": s.latency["ttft"]["p50"] * 1000, "completed": s.num_completed, "errors": s.num_errors,
            "input_tokens_per_request": s.total_input_tokens / max(1, s.num_completed)}


def run_guidellm(exe: Path, url: str, concurrency: int, num: int, input_len: int, output_len: int) -> dict:
    out = Path(tempfile.mkdtemp(prefix="guidellm-")) / "out.json"
    cmd = [str(exe), "run", "--backend", f"kind=openai_http,target={url}",
           "--profile", f"kind=concurrent,streams={concurrency}",
           "--constraint", f"kind=max_requests,count={num}",
           "--data", f"kind=synthetic_text,prompt_tokens={input_len},output_tokens={output_len}",
           "--tokenizer", f"kind=huggingface_auto,model={_tokenizer_dir()}",
           "--output", f"kind=json,path={out}", "--disable-progress"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    if r.returncode != 0 or not out.is_file():
        raise RuntimeError("guidellm failed: " + " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:]))
    b = json.loads(out.read_text())["benchmarks"][0]
    m = b["metrics"]
    ok = m["request_totals"]["successful"]
    reqs = b["requests"]["successful"]
    # the same span tokenops uses: first request sent -> last answer received
    span = max(r["request_end_time"] for r in reqs) - min(r["request_start_time"] for r in reqs)
    print(f"guidellm: {ok} requests; its own duration {b['duration']:.2f}s -> {ok / b['duration']:.2f} req/s; "
          f"first send to last answer {span:.2f}s")
    return {"requests_per_s": ok / span, "output_tokens_per_s": m["output_token_count"]["successful"]["total_sum"] / span,
            "ttft_median_ms": m["time_to_first_token_ms"]["successful"]["median"], "completed": ok,
            "errors": m["request_totals"]["errored"],
            "input_tokens_per_request": m["prompt_token_count"]["successful"]["mean"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", help="target server (default: the fake server from tests/bench)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--venv", default=str(VENV))
    ap.add_argument("--step-ms", type=float, default=20.0,
                    help="fake server step time; TTFT is quantised to it, so small client timing differences "
                         "in closed loops show up as whole steps")
    args = ap.parse_args()
    exe, how = ensure_guidellm(Path(args.venv))
    if exe is None:
        print(f"GuideLLM cannot run here: {how}")
        return 0
    version = subprocess.run([str(exe), "--version"], capture_output=True, text=True).stdout.strip()
    print(f"{version} ({how}, venv {args.venv})")
    server = None
    url = args.url
    if url is None:
        # a separate process, so neither load generator shares an interpreter with the server
        code = ("import sys, time; sys.path.insert(0, sys.argv[1]); from fake_server import FakeEngine, FakeServer; "
                "s = FakeServer(FakeEngine(base_s=float(sys.argv[3]), per_token_s=0.0, max_num_seqs=int(sys.argv[2])))"
                ".__enter__(); "
                "print(s.url, flush=True); time.sleep(3600)")
        server = subprocess.Popen([sys.executable, "-c", code, str(ROOT / "tests" / "bench"), str(args.concurrency),
                                   str(args.step_ms / 1000)],
                                  stdout=subprocess.PIPE, text=True)
        url = server.stdout.readline().strip()
        print(f"target: fake server {url} in its own process ({args.step_ms:g} ms per engine step, prompt tokens free, "
              f"{args.concurrency} slots)")
    else:
        print(f"target: {url}")
    print(f"workload: {args.requests} requests, concurrency {args.concurrency}, {args.input_len} prompt tokens "
          f"(each tool's own text), {args.output_len} output tokens")
    try:
        run_tokenops(url, args.concurrency, max(8, args.concurrency), args.input_len, args.output_len)  # warm-up
        t = time.time()
        ours = run_tokenops(url, args.concurrency, args.requests, args.input_len, args.output_len)
        print(f"tokenops bench done in {time.time() - t:.1f}s")
        t = time.time()
        try:
            theirs = run_guidellm(exe, url, args.concurrency, args.requests, args.input_len, args.output_len)
        except (RuntimeError, KeyError, subprocess.SubprocessError) as e:
            print(f"GuideLLM cannot run here: {e}")
            return 0
        print(f"guidellm run done in {time.time() - t:.1f}s")
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
    print(f"{'figure':<26}{'tokenops':>12}{'guidellm':>12}{'diff':>9}")
    worst = 0.0
    for key in ("requests_per_s", "output_tokens_per_s", "ttft_median_ms", "input_tokens_per_request", "completed",
                "errors"):
        a, b = ours[key], theirs[key]
        diff = (a - b) / b if b else float("nan")
        if key in ("requests_per_s", "ttft_median_ms", "output_tokens_per_s"):
            worst = max(worst, abs(diff))
        print(f"{key:<26}{a:>12.2f}{b:>12.2f}{diff:>+9.1%}")
    print(f"largest difference on throughput / median TTFT: {worst:.1%} -> {'within' if worst <= 0.10 else 'OUTSIDE'} 10%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
