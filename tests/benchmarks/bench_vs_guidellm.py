"""`tokenops bench` against GuideLLM (an independent load generator) on the same
server and workload: request throughput and median TTFT should agree within 10%.

GuideLLM is installed by this script into its own venv under /tmp (pip), never
into the project's environment. Targets: the test suite's fake OpenAI-compatible
server in its own process (default), the bundled ``tokenops serve`` (``--serve``),
or any server (``--url``).

The same workload for both tools
--------------------------------
* **The same requests.** Each run's requests are one JSON Lines file that both
  tools read (``tokenops bench --workload file``, GuideLLM ``kind=json_file``):
  the same prompt and answer lengths in the same order (normal around
  ``--input-len`` / ``--output-len``, relative std ``--length-spread``, 0.25),
  answers forced to length (``ignore_eos``). The prompt words are drawn afresh
  for every run, so no run finds an earlier run's prompts in the prefix cache.
* **The same sampling.** GuideLLM sends no temperature, so the server samples at
  its default (1.0); tokenops bench sends 0 (greedy) unless told otherwise, and
  here is told to send none as well. It matters: before the engine's sampler was
  changed (``torch.multinomial`` took ~7 ms per step on CPU) the demo engine
  served sampled requests ~15% slower than greedy ones, which showed up here as
  a throughput gap.
* **The same moment.** The machine's speed drifts by tens of percent over
  minutes (a busy neighbour on the host; little of it shows as CPU steal), so
  runs are interleaved, tokenops first and last, ``t g t g ... t``
  (``--repeats`` GuideLLM runs, 5), and each GuideLLM run is compared with the
  mean of the tokenops runs just before and after it. The verdict uses the
  median of these paired differences, so a steady drift cancels from each pair
  and one run caught by a burst of load on the host does not decide it. The
  difference of the two tools' overall means is printed beside it, with every
  run in order and the CPU steal time.

What is compared
----------------
Both tools start the TTFT clock at the same point (httpx trace event
``send_request_headers.started``) and stop it at the first SSE chunk with
non-empty content, and count throughput over the same span (first request sent
to last answer received; GuideLLM's own duration also counts its start-up).
For each scenario the script prints both tools' request and token throughput,
median TTFT, the mean number of requests in flight (Little's law: summed
latency over the span), token counts per request, errors, and the server's own
view: its TTFT histogram from ``/metrics`` for a real server, or for the fake
server the TTFT it saw, each client's reaction time (answer end to next
request) and the TCP connections used.

Closed loops and the client's reaction time
-------------------------------------------
A continuous-batching server admits a request only between engine steps, so in
a closed loop the next request's wait depends on how fast the client reacts to
the previous answer: a request that arrives ``r`` ms into a step waits
``step - r`` for it to end, then a step for its prefill, TTFT ~ 2*step -
(r mod step). Measured against the fake server's 20 ms step clock, adding
0/3/6/10 ms to tokenops bench's reaction moved the *server-side* median TTFT
32 -> 29 -> 27 -> 28 ms. The server sees GuideLLM react in ~7-15 ms and us in
~3-9 ms: GuideLLM passes each completion through its scheduler process and
opens a new TCP connection per request (it stops reading at ``[DONE]``, so
httpx discards the connection); we keep one connection per client. GuideLLM
therefore also keeps slightly fewer requests in flight (~7.7 of 8 on the real
server), which costs it a few percent of closed-loop throughput.

With *fixed* lengths there is a second, larger effect: clients that start
together stay in lockstep. They finish in the same step, come back within a
few ms of each other and are prefilled together; a faster, more uniform client
keeps the lockstep, GuideLLM's jitter slowly breaks it. On ``tokenops serve``
this gave tokenops bench a median TTFT of ~100-120 ms against GuideLLM's
~65-75 ms, and 10-25% more throughput (full batches, batched prefills): the
server really served the two clients' requests differently (its own histogram
shows the same gap), so this is a difference of workload, not of measurement.
Varied lengths, as in any real workload, dissolve the lockstep within a few
requests per client; the fixed-length closed loop is still run on a real server
and printed (``closed/fixed``), not judged. The start of a closed loop (every
client at once) still weighs on a short run: at concurrency 16 with 128
requests (8 per client) our median TTFT came out 10% above GuideLLM's, with 384
requests 0.9% below it; hence ``--requests`` defaults to 16 per client above
concurrency 8.

Scenarios
---------
Fake server: ``closed/step`` (closed loop against a shared step clock: printed,
not judged, its TTFT measures the clients' reaction times as much as the
server), ``closed/timer`` (closed loop against ``FixedLatencyEngine``, every
request on its own timer: judged), ``open/step`` (both tools send at the same
constant rate against the step clock, with enough slots that nothing queues:
judged). Real server (``--serve`` / ``--url``): ``closed`` (concurrency 8,
judged), ``open`` (constant rate, by default half the closed-loop throughput,
judged), ``closed/fixed`` (fixed lengths, not judged). Exit status 1 when a
judged figure differs by more than 10%, 0 when within (or when GuideLLM cannot
run here).

On a small machine the load generator shares the CPUs with the server, and
GuideLLM uses ~2.5x our CPU per request; ``--server-cpus`` / ``--client-cpus``
pin the server and the load generators (this script, GuideLLM and its workers)
to separate CPUs so a heavier client cannot slow the server it measures. On a
2-core box: ``--serve --server-cpus 0 --client-cpus 1``.

Run: .venv/bin/python tests/benchmarks/bench_vs_guidellm.py [--serve --server-cpus 0 --client-cpus 1 | --url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV = Path("/tmp/tokenops-guidellm-venv")
JUDGED_KEYS = ("requests_per_s", "ttft_median_ms")


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


#: tokenops bench --ramp-up for closed loops (set from --ramp-up).
RAMP_UP_S = 0.0
_DATA_DIR = Path(tempfile.mkdtemp(prefix="bench-vs-guidellm-"))


def write_dataset(num: int, input_len: int, output_len: int, spread: float, run: int) -> Path:
    """The requests of one run as JSON Lines, read by both tools (tokenops bench ``--workload file``,
    GuideLLM ``kind=json_file``), so both send the same prompt and answer lengths in the same order.

    Lengths are normal with relative standard deviation ``spread`` (fixed at 0) and the same in every
    run; the prompt words are drawn afresh per ``run``, so no run finds an earlier run's prompts in the
    server's prefix cache."""
    import numpy as np

    from tokenops.bench.synthetic import lengths, words

    rng = np.random.default_rng(0)
    dist = "normal" if spread else "fixed"
    ins, outs = lengths(num, input_len, dist, spread, rng), lengths(num, output_len, dist, spread, rng)
    text = np.random.default_rng(1000 + run)
    path = _DATA_DIR / f"requests-{num}-{input_len}-{output_len}-{spread:g}-run{run}.jsonl"
    path.write_text("".join(json.dumps({"prompt": words(n, text), "output_tokens_count": m, "prompt_tokens_count": n})
                            + "\n" for n, m in zip(ins, outs)))
    return path


def run_tokenops(url: str, concurrency: int | None, rate: float | None, num: int, dataset: Path) -> dict:
    from tokenops.bench.runner import BenchPlan, run_plan

    # temperature=None: no temperature in the request, as GuideLLM sends none (both get the server's default
    # sampling; greedy requests cost the demo engine ~15% less time per token than sampled ones)
    plan = BenchPlan(url=url, workload="file", num_requests=num, ignore_eos=True, temperature=None,
                     concurrencies=[concurrency] if concurrency else [], rates=[rate] if rate else [],
                     arrival="constant", ramp_up_s=RAMP_UP_S if concurrency else 0.0,
                     workload_options={"dataset": str(dataset)})
    t0 = time.time()
    level = asyncio.run(run_plan(plan)).levels[0]
    s, ok = level.summary, [r for r in level.results if r.is_ok]
    span = max(r.start_s + r.e2e_s for r in ok) - min(r.start_s for r in ok)
    return {"requests_per_s": s.request_rate, "output_tokens_per_s": s.output_tps,
            "in_flight_mean": sum(r.e2e_s for r in ok) / span,  # Little's law: requests in flight on average
            "ttft_median_ms": s.latency["ttft"]["p50"] * 1000, "completed": s.num_completed, "errors": s.num_errors,
            "input_tokens_per_request": s.total_input_tokens / max(1, s.num_completed),
            "output_tokens_per_request": s.total_output_tokens / max(1, s.num_completed),
            "_span": (t0 + min(r.start_s for r in ok), t0 + max(r.start_s + r.e2e_s for r in ok))}


def run_guidellm(exe: Path, url: str, concurrency: int | None, rate: float | None, num: int, dataset: Path) -> dict:
    out = Path(tempfile.mkdtemp(prefix="guidellm-")) / "out.json"
    profile = f"kind=concurrent,streams={concurrency}" if concurrency else f"kind=constant,rate={rate}"
    cmd = [str(exe), "run", "--backend", f"kind=openai_http,target={url}", "--profile", profile,
           "--constraint", f"kind=max_requests,count={num}", "--data", f"kind=json_file,path={dataset}",
           "--tokenizer", f"kind=huggingface_auto,model={_tokenizer_dir()}",
           "--output", f"kind=json,path={out}", "--disable-progress"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    if r.returncode != 0 or not out.is_file():
        raise RuntimeError("guidellm failed: " + " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:]))
    b = json.loads(out.read_text())["benchmarks"][0]
    m = b["metrics"]
    ok = m["request_totals"]["successful"]
    reqs = b["requests"]["successful"]
    # the same span tokenops uses: first request sent -> last answer received (GuideLLM's own duration
    # also counts its start-up)
    span = max(r["request_end_time"] for r in reqs) - min(r["request_start_time"] for r in reqs)
    out_tokens = m["output_token_count"]["successful"]["total_sum"]
    return {"requests_per_s": ok / span, "output_tokens_per_s": out_tokens / span,
            "in_flight_mean": sum(r["request_end_time"] - r["request_start_time"] for r in reqs) / span,
            "ttft_median_ms": m["time_to_first_token_ms"]["successful"]["median"], "completed": ok,
            "errors": m["request_totals"]["errored"],
            "input_tokens_per_request": m["prompt_token_count"]["successful"]["mean"],
            "output_tokens_per_request": out_tokens / max(1, ok), "_own_duration_s": b["duration"],
            "_span": (min(r["request_start_time"] for r in reqs), max(r["request_end_time"] for r in reqs)),
            "_report": str(out)}


# --- the fake server, in its own process so neither load generator shares an interpreter with it ---

#: CPUs for servers this script starts (None: no pinning); set from --server-cpus.
SERVER_CPUS: set[int] | None = None
#: CPUs of this script and GuideLLM (None: no pinning); set from --client-cpus.
CLIENT_CPUS: set[int] | None = None
#: /proc/stat sampler for the runs' CPU shares (started in main).
MONITOR: "CpuMonitor | None" = None


def _pin_server():
    if SERVER_CPUS:
        os.sched_setaffinity(0, SERVER_CPUS)


def start_fake(engine_expr: str) -> tuple[subprocess.Popen, str]:
    code = ("import sys, time; sys.path.insert(0, sys.argv[1]); "
            "from fake_server import FakeEngine, FixedLatencyEngine, FakeServer; "
            f"s = FakeServer({engine_expr}).__enter__(); print(s.url, flush=True); time.sleep(3600)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(ROOT / "tests" / "bench")], stdout=subprocess.PIPE,
                            text=True, preexec_fn=_pin_server)
    return proc, proc.stdout.readline().strip()


def start_serve():
    """``tokenops serve`` on the embedded demo model through tune's launcher (a free loopback port,
    a scratch store, waits for /ready), pinned to --server-cpus with as many torch threads."""
    from tokenops.tune.errors import TuneError
    from tokenops.tune.launcher import TokenopsLauncher

    params = {"engine.torch_threads": len(SERVER_CPUS)} if SERVER_CPUS else {}
    server = TokenopsLauncher().prepare(params)
    if SERVER_CPUS:
        server.argv = ["taskset", "-c", ",".join(map(str, sorted(SERVER_CPUS))), *server.argv]
    try:
        return server.start()
    except TuneError as e:
        raise SystemExit(f"cannot start tokenops serve: {e}") from None


def fake_log(url: str) -> list[dict]:
    """What the fake server saw since the last call (and clear it)."""
    import httpx

    seen = httpx.get(url + "/fake/requests", timeout=10).json()["requests"]
    httpx.post(url + "/fake/requests/reset", timeout=10)
    return seen


def server_view(seen: list[dict], concurrency: int | None) -> dict:
    """The server's side of one run: its own TTFT, the clients' reaction time, connections used."""
    ttft = [(r["first_token"] - r["arrived"]) * 1000 for r in seen if r["first_token"] is not None]
    view = {"server_ttft_median_ms": statistics.median(ttft) if ttft else float("nan"),
            "connections": len({r["peer"] for r in seen})}
    if concurrency:
        # closed loop: the k-th arrival after the first `concurrency` answers the (k - concurrency)-th finish
        arrivals = sorted(r["arrived"] for r in seen)
        ends = sorted(r["last_token"] for r in seen if r["last_token"] is not None)
        gaps = [(a - e) * 1000 for a, e in zip(arrivals[concurrency:], ends)]
        view["reaction_median_ms"] = statistics.median(gaps) if gaps else float("nan")
    return view


_BUCKET = re.compile(r'^(\w+):time_to_first_token_seconds_bucket\{([^}]*)\}\s+(\S+)', re.M)
_COUNT = re.compile(r'^(\w+):time_to_first_token_seconds_(sum|count)\{([^}]*)\}\s+(\S+)', re.M)


def ttft_histogram(url: str) -> dict | None:
    """The server's own TTFT histogram from Prometheus /metrics (tokenops: or vllm: names), summed over models."""
    import httpx

    try:
        text = httpx.get(url.rstrip("/").removesuffix("/v1") + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    buckets: dict[float, float] = {}
    for _, labels, v in _BUCKET.findall(text):
        le = re.search(r'le="([^"]+)"', labels)
        if le:
            buckets[float(le.group(1))] = buckets.get(float(le.group(1)), 0.0) + float(v)
    if not buckets:
        return None
    totals = {"sum": 0.0, "count": 0.0}
    for _, kind, _, v in _COUNT.findall(text):
        totals[kind] += float(v)
    return {"buckets": buckets, **totals}


def histogram_view(before: dict | None, after: dict | None) -> dict | None:
    """Median (interpolated within its bucket) and mean TTFT of the requests between two /metrics scrapes."""
    if not before or not after:
        return None
    n = after["count"] - before["count"]
    if n <= 0:
        return None
    cum = sorted((le, after["buckets"][le] - before["buckets"].get(le, 0.0)) for le in after["buckets"])
    lo, below, median = 0.0, 0.0, float("nan")
    for le, c in cum:
        if c >= n / 2:
            median = le if le == float("inf") else lo + (le - lo) * (n / 2 - below) / max(c - below, 1e-9)
            break
        lo, below = le, c
    return {"server_ttft_median_ms": median * 1000, "server_ttft_mean_ms": (after["sum"] - before["sum"]) / n * 1000,
            "requests": int(n)}


def _mean(runs: list[dict]) -> dict:
    return {k: sum(r[k] for r in runs) / len(runs) for k in runs[0] if isinstance(runs[0][k], (int, float))}


def _cpu_times() -> dict[str, list[int]]:
    """CPU jiffies per line of /proc/stat ("cpu" for all, "cpu0", "cpu1", ...: user nice system idle iowait
    irq softirq steal ...)."""
    try:
        with open("/proc/stat") as f:
            return {p[0]: [int(x) for x in p[1:]] for p in (line.split() for line in f) if p and p[0].startswith("cpu")}
    except OSError:
        return {}


class CpuMonitor:
    """Samples /proc/stat every 0.2 s in a thread, so CPU shares can be taken over any span afterwards (for
    GuideLLM: the span of its requests, not its start-up)."""

    def __init__(self, period_s: float = 0.2) -> None:
        import threading

        self.samples: list[tuple[float, dict[str, list[int]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period_s,), daemon=True)
        self._thread.start()

    def _run(self, period_s: float) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), _cpu_times()))
            self._stop.wait(period_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def shares(self, t0: float, t1: float, cpus: set[int] | None) -> dict:
        """Between the samples nearest ``t0`` and ``t1``: the share of CPU time the hypervisor gave to other
        guests (all CPUs), and how busy the load generators' CPUs were (when they are pinned)."""
        out = {"steal_share": float("nan"), "client_cpu_busy": float("nan")}
        if len(self.samples) < 2:
            return out
        before = min(self.samples, key=lambda s: abs(s[0] - t0))[1]
        after = min(self.samples, key=lambda s: abs(s[0] - t1))[1]

        def delta(name: str) -> list[int]:
            return [a - b for a, b in zip(after.get(name, []), before.get(name, []))]

        d = delta("cpu")
        if len(d) >= 8 and sum(d[:8]):
            out["steal_share"] = d[7] / sum(d[:8])
        if cpus:
            busy = total = 0
            for c in cpus:
                d = delta(f"cpu{c}")
                if len(d) >= 8:
                    busy += sum(d[:8]) - d[3] - d[4]
                    total += sum(d[:8])
            out["client_cpu_busy"] = busy / total if total else float("nan")
        return out


def paired_difference(ours_runs: list[dict], theirs_runs: list[dict], key: str) -> float:
    """The median, over GuideLLM's runs, of (mean of the two tokenops runs either side) / GuideLLM - 1.

    Each GuideLLM run is compared with the tokenops runs just before and after it, so a drift of the
    machine's speed over minutes (tens of percent here) cancels from each pair, and the median keeps one
    run caught by a burst of load on the host from deciding the verdict."""
    ratios = []
    for i, t in enumerate(theirs_runs):
        o = (ours_runs[i][key] + ours_runs[i + 1][key]) / 2
        ratios.append(o / t[key] - 1 if t[key] else float("nan"))
    return statistics.median(ratios) if ratios else float("nan")


def compare(name: str, judged: bool, ours_runs: list[dict], theirs_runs: list[dict], views: dict) -> float:
    """Print one scenario's figures: each tool's mean over its interleaved runs, the difference of the means,
    the paired difference (:func:`paired_difference`) and every run in order; return the larger paired
    difference on request throughput and median TTFT (the verdict's figure)."""
    ours, theirs = _mean(ours_runs), _mean(theirs_runs)
    print(f"\n[{name}] {'judged' if judged else 'not judged (see docstring)'}")
    print(f"  {'figure':<26}{'tokenops':>10}{'guidellm':>10}{'means':>8}{'paired':>8}   "
          f"runs in order (t = tokenops, g = guidellm)")
    worst = 0.0

    def runs_text(key: str, o_runs: list[dict], t_runs: list[dict]) -> str:
        order = [f"t {o_runs[0][key]:.1f}"]
        for t, o in zip(t_runs, o_runs[1:]):
            order += [f"g {t[key]:.1f}", f"t {o[key]:.1f}"]
        return ", ".join(order)

    def row(label: str, key: str, o_runs: list[dict], t_runs: list[dict]) -> float:
        a, b = _mean(o_runs)[key], _mean(t_runs)[key]
        diff = (a - b) / b if b else float("nan")
        paired = paired_difference(o_runs, t_runs, key)
        print(f"  {label:<26}{a:>10.2f}{b:>10.2f}{diff:>+8.1%}{paired:>+8.1%}   {runs_text(key, o_runs, t_runs)}")
        return paired

    for key in ("requests_per_s", "output_tokens_per_s", "ttft_median_ms", "in_flight_mean", "input_tokens_per_request",
                "output_tokens_per_request", "completed", "errors"):
        paired = row(key, key, ours_runs, theirs_runs)
        if key in JUDGED_KEYS:
            worst = max(worst, abs(paired)) if paired == paired else float("inf")  # no figure: a failure
    print(f"  {'CPU steal (hypervisor)':<26}{ours['steal_share']:>10.1%}{theirs['steal_share']:>10.1%}")
    if ours["client_cpu_busy"] == ours["client_cpu_busy"]:
        print(f"  {'load generator CPUs busy':<26}{ours['client_cpu_busy']:>10.1%}{theirs['client_cpu_busy']:>10.1%}"
              f"   (near 100%: the client itself is a bottleneck)")
    if views.get("tokenops") and views.get("guidellm"):
        o_runs, t_runs = views["tokenops"], views["guidellm"]
        o, t = _mean(o_runs), _mean(t_runs)
        for key, label in (("server_ttft_median_ms", "server: median TTFT ms"),
                           ("server_ttft_mean_ms", "server: mean TTFT ms"),
                           ("reaction_median_ms", "server: reaction ms"), ("connections", "server: TCP connections")):
            if key in o and key in t:
                row(label, key, o_runs, t_runs)
        if "server_ttft_median_ms" in o:
            print(f"  {'client - server TTFT ms':<26}{ours['ttft_median_ms'] - o['server_ttft_median_ms']:>10.2f}"
                  f"{theirs['ttft_median_ms'] - t['server_ttft_median_ms']:>10.2f}   (median minus median)")
    print(f"  largest paired difference on request throughput / median TTFT: {worst:.1%}"
          + (f" -> {'within' if worst <= 0.10 else 'OUTSIDE'} 10%" if judged else ""))
    return worst


def run_scenario(exe: Path, args, name: str, judged: bool, url: str, concurrency: int | None,
                 rate: float | None, spread: float, fake: bool) -> tuple[dict, float]:
    """Interleaved runs on the same request lengths, tokenops bench first and last: t g t g ... t
    (``--repeats`` GuideLLM runs), so both tools' runs are centred on the same moment and a steady drift
    of the server or the machine cancels out of the means. Each run comes with the server's own view of
    it where there is one."""
    level = f"concurrency {concurrency}" if concurrency else f"constant rate {rate:g}/s"
    lens = f"lengths normal, relative std {spread:g}" if spread else "fixed lengths"
    print(f"\n== {name}: {level}, {lens}, load average {os.getloadavg()[0]:.2f}", flush=True)
    data = lambda run: write_dataset(args.requests, args.input_len, args.output_len, spread, run)  # noqa: E731
    run_tokenops(url, concurrency, rate, args.requests, data(0))  # warm-up: the server's shapes and caches
    runs: dict[str, list[dict]] = {"tokenops": [], "guidellm": []}
    views: dict[str, list[dict]] = {"tokenops": [], "guidellm": []}
    order = ["tokenops"] + ["guidellm", "tokenops"] * args.repeats
    for run, tool in enumerate(order, 1):
        if fake:
            fake_log(url)
        before = None if fake else ttft_histogram(url)
        t = time.time()
        if tool == "tokenops":
            result = run_tokenops(url, concurrency, rate, args.requests, data(run))
            print(f"  tokenops bench: {time.time() - t:.1f}s", flush=True)
        else:
            result = run_guidellm(exe, url, concurrency, rate, args.requests, data(run))
            print(f"  guidellm: {time.time() - t:.1f}s (its own benchmark duration {result['_own_duration_s']:.2f}s; "
                  f"report {result['_report']})", flush=True)
        result.update(MONITOR.shares(*result["_span"], CLIENT_CPUS))
        runs[tool].append(result)
        view = server_view(fake_log(url), concurrency) if fake else histogram_view(before, ttft_histogram(url))
        if view is not None:
            views[tool].append(view)
    if any(len(views[k]) != len(runs[k]) for k in runs):
        views = {}
    return _mean(runs["tokenops"]), compare(name, judged, runs["tokenops"], runs["guidellm"], views)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", help="target server (default: the fake server from tests/bench)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--rate", type=float, help="open-loop constant rate, req/s (default: half the closed-loop "
                                                "throughput tokenops measured)")
    ap.add_argument("--requests", type=int, help="requests per run (default: 128, or 16 per client when "
                                                  "--concurrency is above 8: a closed loop's start, with every "
                                                  "client starting at once, must not dominate the run)")
    ap.add_argument("--repeats", type=int, default=5, help="GuideLLM runs per scenario, each between two tokenops "
                                                            "bench runs")
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--venv", default=str(VENV))
    ap.add_argument("--step-ms", type=float, default=20.0, help="fake server: engine step time (and the timer "
                                                                "engine's inter-token latency)")
    ap.add_argument("--ttft-ms", type=float, default=40.0, help="fake timer engine: every request's TTFT")
    ap.add_argument("--ramp-up", type=float, default=0.0,
                    help="closed loops: start tokenops bench's clients evenly over this many seconds (tokenops bench "
                         "--ramp-up); 0 starts them together, which can keep them in lockstep")
    ap.add_argument("--length-spread", type=float, default=0.25,
                    help="relative standard deviation of prompt and output lengths (normal; the same lengths for "
                         "both tools); 0: fixed lengths")
    ap.add_argument("--serve", action="store_true", help="launch the bundled tokenops serve (demo model) as the target")
    ap.add_argument("--server-cpus", help="pin servers started here to these CPUs, e.g. 0")
    ap.add_argument("--client-cpus", help="pin this script and GuideLLM to these CPUs, e.g. 1")
    ap.add_argument("--scenarios", default="all",
                    help="comma-separated subset: closed/step, closed/timer, open/step (fake) or closed, open, "
                         "closed/fixed (--url)")
    args = ap.parse_args()
    global SERVER_CPUS, CLIENT_CPUS, RAMP_UP_S, MONITOR
    RAMP_UP_S = args.ramp_up
    parse_cpus = lambda text: {int(x) for x in text.split(",") if x.strip()} if text else None  # noqa: E731
    SERVER_CPUS, client_cpus = parse_cpus(args.server_cpus), parse_cpus(args.client_cpus)
    CLIENT_CPUS, MONITOR = client_cpus, CpuMonitor()
    if args.serve and args.url:
        raise SystemExit("give --url or --serve, not both")
    if args.requests is None:
        args.requests = max(128, 16 * args.concurrency)
    if args.repeats < 1 or args.requests < 8:
        raise SystemExit("--repeats must be >= 1 and --requests >= 8")
    exe, how = ensure_guidellm(Path(args.venv))
    if exe is None:
        print(f"GuideLLM cannot run here: {how}")
        return 0
    version = subprocess.run([str(exe), "--version"], capture_output=True, text=True).stdout.strip()
    print(f"{version} ({how}, venv {args.venv}); load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"workload: {args.requests} requests from one JSON Lines file per run, read by both tools: "
          f"{args.input_len} prompt tokens, {args.output_len} output tokens (means; relative std "
          f"{args.length_spread:g}), ignore EOS")
    c, step = args.concurrency, args.step_ms / 1000
    serve_proc = None
    if args.serve:
        serve_proc = start_serve()
        args.url = serve_proc.url
        import atexit

        atexit.register(serve_proc.stop)  # early returns too (stop() is idempotent)
        print(f"launched tokenops serve (demo model) at {args.url}")
    if client_cpus:
        os.sched_setaffinity(0, client_cpus)  # GuideLLM and its worker processes inherit it
    if SERVER_CPUS or client_cpus:
        print(f"CPU pinning: servers {sorted(SERVER_CPUS or [])}, load generators {sorted(client_cpus or [])}")
    if args.url:
        print(f"target: {args.url}")
        spread = args.length_spread
        scenarios = [("closed", True, None, c, None, spread), ("open", True, None, None, args.rate, spread),
                     ("closed/fixed", False, None, c, None, 0.0)]
    else:
        print(f"target: fake server in its own process: step clock {args.step_ms:g} ms per step, or per-request "
              f"timers {args.ttft_ms:g} ms TTFT + {args.step_ms:g} ms ITL")
        scenarios = [
            ("closed/step", False, f"FakeEngine(base_s={step}, per_token_s=0.0, max_num_seqs={c})", c, None,
             args.length_spread),
            ("closed/timer", True, f"FixedLatencyEngine(ttft_s={args.ttft_ms / 1000}, itl_s={step})", c, None,
             args.length_spread),
            ("open/step", True, f"FakeEngine(base_s={step}, per_token_s=0.0, max_num_seqs={8 * c})", None,
             args.rate, args.length_spread)]
    if args.scenarios != "all":
        wanted = {w.strip() for w in args.scenarios.split(",") if w.strip()}
        unknown = wanted - {s[0] for s in scenarios}
        if unknown:
            raise SystemExit(f"unknown scenario(s) {', '.join(sorted(unknown))}; here: "
                             f"{', '.join(s[0] for s in scenarios)}")
        scenarios = [s for s in scenarios if s[0] in wanted]
    results = []
    closed_rate = None
    for name, judged, engine, conc, rate, spread in scenarios:
        if conc is None and rate is None:
            if closed_rate is None:  # no closed-loop run this time: measure the closed-loop throughput quickly
                proc, url = start_fake(engine) if engine else (None, args.url)
                try:
                    closed_rate = run_tokenops(url, c, None, args.requests, write_dataset(
                        args.requests, args.input_len, args.output_len, spread, 0))["requests_per_s"]
                finally:
                    if proc:
                        proc.terminate()
                        proc.wait(timeout=10)
            rate = round(0.5 * closed_rate, 2)
        proc, url = start_fake(engine) if engine else (None, args.url)
        try:
            ours, worst = run_scenario(exe, args, name, judged, url, conc, rate, spread, engine is not None)
        except (RuntimeError, KeyError, subprocess.SubprocessError) as e:
            print(f"GuideLLM cannot run here: {e}")
            return 0
        finally:
            if proc:
                proc.terminate()
                proc.wait(timeout=10)
        if conc is not None and closed_rate is None and spread == args.length_spread:
            closed_rate = ours["requests_per_s"]
        results.append((name, judged, worst))
    if serve_proc is not None:
        serve_proc.stop()
    judged = [(n, w) for n, j, w in results if j]
    worst = max((w for _, w in judged), default=0.0)
    print(f"\nload average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for n, j, w in results:
        print(f"  {n:<14} largest paired throughput/TTFT difference {w:6.1%}" + ("" if j else "  (not judged)"))
    ok = worst <= 0.10
    print(f"verdict over judged scenarios ({', '.join(n for n, _ in judged)}): {worst:.1%} -> "
          f"{'within' if ok else 'OUTSIDE'} 10%")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
