"""Tool-calling benchmark: generated cases (tests/benchmarks/tool_call_cases.py, four kinds:
one obvious tool, choose among several, parallel calls, irrelevance) sent with the openai SDK to
``tokenops serve`` on the default model (SmolLM2-135M-Instruct, its generic tool format), greedy,
``tool_choice`` auto (``parallel_tool_calls: true`` for the parallel kind).

A case is right when the calls made are exactly the expected ones: same tool names, each call's
``arguments`` valid JSON that validates against the tool's ``parameters``, and argument values equal
(strings compared case-insensitively, numbers numerically); for irrelevance, when no tool is called.
Calls whose ``arguments`` do not parse are counted apart ("invalid JSON"): the grammar should make
that 0. ``--peer URL`` runs the same cases against another OpenAI-compatible server (``--peer-model``).

``--model PATH`` serves a GGUF file instead (tokenops serve ``--model PATH``; Qwen2.5-Coder's template
renders tools: its native ``hermes`` format). ``--llamacpp`` runs the same cases through llama.cpp's
``llama-server --jinja`` on the same GGUF file (the default model's when no ``--model``), after
tokenops, one server at a time, and prints both tables and one side by side. The ``llama-server``
binary: ``$TOKENOPS_LLAMA_SERVER``, else the one tests/benchmarks/llamacpp_peer.py builds or finds.

``--answers FILE`` appends every answer (calls and text content, right or not) to a JSON-lines
file as it arrives: what a model wrote where it was wrong, and a partial run's answers. With
``--confidence`` each tokenops answer also carries its calls' confidence, computed from the
answer's logprobs by the free-call gate's rule (tokenops/backends/tool_confidence.py): run it against
a server with ``tool_call_min_confidence = 0`` (``--url``) to choose the gate's threshold.

Run: .venv/bin/python tests/benchmarks/tool_calls.py [--cases 200] [--concurrency 8] [--model GGUF]
     [--llamacpp] [--threads 1] [--peer URL] [--answers FILE [--confidence]]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import jsonschema
import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.benchmarks.tool_call_cases import ToolCase, generate  # noqa: E402

KINDS = ("obvious", "choose", "parallel", "irrelevance")


def _same(value: Any, wanted: Any) -> bool:
    if isinstance(wanted, str):
        return isinstance(value, str) and value.strip().lower() == wanted.lower()
    if isinstance(wanted, (int, float)) and not isinstance(wanted, bool):
        return isinstance(value, (int, float)) and not isinstance(value, bool) and float(value) == float(wanted)
    return value == wanted


def score(case: ToolCase, calls: list[tuple[str, str]]) -> tuple[bool, int]:
    """(right, number of calls whose arguments are not valid JSON)."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in case.tools}
    invalid, made = 0, []
    for name, arguments in calls:
        try:
            args = json.loads(arguments)
            jsonschema.validate(args, schemas.get(name, {}))
        except json.JSONDecodeError:
            invalid += 1
            continue
        except jsonschema.ValidationError:
            continue
        made.append((name, args))
    if len(made) != len(calls) or len(calls) != len(case.expected):
        return False, invalid
    left = list(case.expected)
    for name, args in made:
        match = next(
            (
                e
                for e in left
                if e[0] == name and e[1].keys() == args.keys() and all(_same(args[k], v) for k, v in e[1].items())
            ),
            None,
        )
        if match is None:
            return False, invalid
        left.remove(match)
    return True, invalid


def ask(
    client: openai.OpenAI, model: str, case: ToolCase, max_tokens: int, confidence: bool = False
) -> tuple[list[tuple[str, str]], str, list[float | None]]:
    """(the calls made: name and ``arguments`` text, the answer's text content, and with ``confidence``
    each call's confidence by the gate's rule (tokenops/backends/tool_confidence.py) from the logprobs)."""
    extra: dict[str, Any] = {"parallel_tool_calls": True} if case.kind == "parallel" else {}
    if confidence:
        extra["logprobs"] = True
    out = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": case.prompt}],
        tools=case.tools,
        tool_choice="auto",
        temperature=0,
        max_tokens=max_tokens,
        **extra,
    )
    message = out.choices[0].message
    calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
    confidences: list[float | None] = []
    if confidence and out.choices[0].logprobs is not None:
        from tokenops.backends.tool_confidence import CallConfidence

        judge = CallConfidence(threshold=0.0)
        judge.add([e.model_dump() for e in out.choices[0].logprobs.content or []])
        confidences = [judge.confidence(name, arguments) for name, arguments in calls]
    return calls, message.content or "", confidences


def run(
    base_url: str,
    model: str,
    cases: list[ToolCase],
    concurrency: int,
    max_tokens: int,
    answers: Path | None = None,
    confidence: bool = False,
) -> dict[str, list[int]]:
    """Per kind: [right, total, invalid-JSON calls]. ``answers``: a JSON-lines file that gets each
    case's answer as it arrives (kind, prompt, tools offered, expected and made calls, content, right)."""
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=1800)
    table = {kind: [0, 0, 0] for kind in KINDS}
    with ThreadPoolExecutor(concurrency) as pool, contextlib.ExitStack() as stack:
        log = stack.enter_context(answers.open("a", encoding="utf-8")) if answers else None
        futures = {pool.submit(ask, client, model, c, max_tokens, confidence): c for c in cases}
        for future in as_completed(futures):
            case = futures[future]
            calls, content, confidences = future.result()
            right, invalid = score(case, calls)
            row = table[case.kind]
            row[0] += right
            row[1] += 1
            row[2] += invalid
            if log is not None:
                entry = {
                    "server": base_url,
                    "kind": case.kind,
                    "prompt": case.prompt,
                    "tools": [t["function"]["name"] for t in case.tools],
                    "expected": case.expected,
                    "calls": calls,
                    "content": content,
                    "right": right,
                }
                if confidence:
                    entry["confidence"] = confidences
                log.write(json.dumps(entry) + "\n")
                log.flush()
    return table


def print_table(title: str, table: dict[str, list[int]], wall_s: float) -> None:
    print(f"\n{title}  ({wall_s:.0f} s)")
    print(f"{'kind':>12}  {'right':>7}  {'share':>6}  {'invalid JSON calls':>18}")
    for kind, (right, total, invalid) in table.items():
        if total:
            print(f"{kind:>12}  {right:>3}/{total:<3}  {right / total:>6.0%}  {invalid:>18}")


def llamacpp_server(gguf: Path, parallel: int, threads: int, ctx_per_slot: int = 4096) -> Any:
    """``llama-server --jinja`` on ``gguf`` (a context manager that yields its /v1 URL)."""
    import os
    import subprocess
    import urllib.request

    from tests.benchmarks.llamacpp_peer import free_port, llama_server

    @contextlib.contextmanager
    def serve() -> Any:
        binary = os.environ.get("TOKENOPS_LLAMA_SERVER") or str(llama_server())
        port = free_port()
        cmd = [
            binary,
            "-m",
            str(gguf),
            "--jinja",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-np",
            str(parallel),
            "-c",
            str(ctx_per_slot * parallel),
            "-t",
            str(threads),
            "-tb",
            str(threads),
            "--no-webui",
        ]
        with tempfile.TemporaryFile("w+") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            try:
                deadline = time.monotonic() + 300
                while True:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        log.seek(0)
                        raise SystemExit(f"llama-server did not start: {log.read()[-2000:]}")
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                            if r.status == 200:
                                break
                    except OSError:
                        time.sleep(0.5)
                yield f"http://127.0.0.1:{port}/v1"
            finally:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()

    return serve()


def side_by_side(tables: dict[str, dict[str, list[int]]]) -> None:
    names = list(tables)
    print(f"\n{'kind':>12}  " + "  ".join(f"{n:>22}" for n in names))
    for kind in KINDS:
        cells = []
        for name in names:
            right, total, invalid = tables[name][kind]
            cells.append(f"{right:>3}/{total:<3} {right / max(total, 1):>4.0%} ({invalid} bad JSON)")
        print(f"{kind:>12}  " + "  ".join(f"{c:>22}" for c in cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=200, help="cases in all (a quarter per kind)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--model", help="a GGUF file tokenops serves (default: the default model, SmolLM2)")
    ap.add_argument("--url", help="an already running tokenops serve (its /v1); default: start one")
    ap.add_argument("--llamacpp", action="store_true", help="also run llama-server --jinja on the same GGUF")
    ap.add_argument("--no-tokenops", action="store_true", help="run the peers only (--llamacpp, --peer)")
    ap.add_argument("--threads", type=int, default=2, help="llama-server's -t")
    ap.add_argument("--peer", help="another OpenAI-compatible server's /v1 to run the same cases against")
    ap.add_argument("--peer-model", default="default")
    ap.add_argument("--answers", type=Path, help="append each case's answer to this JSON-lines file as it arrives")
    ap.add_argument(
        "--confidence",
        action="store_true",
        help="tokenops: ask for logprobs and write each call's confidence (the gate's rule) to --answers",
    )
    args = ap.parse_args()
    cases = generate(max(1, args.cases // 4))
    from tests.real_model import MODEL, SERVE_ENV, gguf_path

    gguf = Path(args.model).expanduser() if args.model else gguf_path()
    model = gguf.stem if args.model else MODEL
    tables: dict[str, dict[str, list[int]]] = {}

    def measure(label: str, base_url: str, name: str) -> None:
        start = time.monotonic()
        tables[label] = run(
            base_url,
            name,
            cases,
            args.concurrency,
            args.max_tokens,
            args.answers,
            args.confidence and label == "tokenops serve",
        )
        print_table(f"{label}, {name}, {len(cases)} cases", tables[label], time.monotonic() - start)

    if args.no_tokenops:
        pass
    elif args.url:
        measure("tokenops serve", args.url, model)
    else:
        from tokenops.testing_serve import ServeProcess

        serve_args = ["--model", str(gguf)] if args.model else []
        with (
            tempfile.TemporaryDirectory() as tmp,
            ServeProcess(tmp, args=serve_args, env=SERVE_ENV, store=False, ready_timeout_s=600) as srv,
        ):
            measure("tokenops serve", srv.base_url, model)
    if args.llamacpp:
        with llamacpp_server(gguf, args.concurrency, args.threads) as url:
            measure("llama-server --jinja", url, model)
    if args.peer:
        measure(f"peer {args.peer}", args.peer, args.peer_model)
    if len(tables) > 1:
        side_by_side(tables)


if __name__ == "__main__":
    main()
