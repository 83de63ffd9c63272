"""Session memory benchmark: facts stated early in a long conversation, asked for after
the history outgrew the context — session memory vs plain truncation.

Each conversation (seeded): the user states "Important: the vault access code is NNNN."
early, plus two distractor codes (gym locker, bike lock), then many filler turns
("Note k: the <thing> shipment to <city> is on schedule.") until the history is several
times the token budget, then asks "What is the vault access code? Reply with the
number only." (the retrieval task of the checkable suites, stretched over turns).

Two ways to fit the prompt into the budget:

- ``truncation``: system message + the newest turns that fit + the question (a sliding
  window, what a client does to avoid context_length_exceeded);
- ``memory``: the session_memory plugin's own hook (``tokenops_fit_context``) with the
  packaged MiniLM embedder: the same newest turns for half the room, the stored entries
  most similar to the question in the rest.

Measured: (1) retrieval accuracy — the fitted prompt contains the right code; (2) answer
accuracy — the model's greedy answer contains the right code (bundled engine, exact
token counts from the model's chat template). The default model is issue 18's
ladder-large (retrained to read a fact out of prompts of up to 512 tokens: held-out
retrieval in ladder_report.json); ``--model`` takes any HF folder. Run::

    .venv/bin/python tests/benchmarks/session_memory.py                       # 20 conversations, budget 512
    .venv/bin/python tests/benchmarks/session_memory.py --model PATH --budget 1024 --num 100
    .venv/bin/python tests/benchmarks/session_memory.py --through-serve       # the same, through tokenops serve

``--through-serve`` asks a real ``tokenops serve`` (the model's context set to the budget,
``[plugins.session_memory]`` on) with the openai SDK, three ways per conversation: the whole
history without a session (the server's answer: 400 context_length_exceeded), the
client-truncated history (as above) and the whole history with an ``x-session-id`` (the
server fits it with memory); answer accuracy of the last two.
"""

from __future__ import annotations

import argparse
import random
import re
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "tokenops" / "demo_models"
LADDER = ("ladder-large", "ladder-small")  # issue 18's task-trained models, when present

THINGS = ["timber", "grain", "cement", "textile", "copper", "coffee", "paper", "glass", "steel", "cotton"]
CITIES = ["Lisbon", "Osaka", "Lagos", "Quito", "Oslo", "Perth", "Tunis", "Riga", "Lima", "Hanoi"]
QUESTION = "What is the vault access code? Reply with the number only."


def conversation(rng: random.Random, num_filler: int, distractors: int = 2) -> tuple[list[dict], str]:
    code = str(rng.randint(1000, 9999))
    facts = [f"Important: the vault access code is {code}.",
             f"By the way, the gym locker code is {rng.randint(1000, 9999)}.",
             f"Also, my bike lock combination is {rng.randint(1000, 9999)}."][:1 + distractors]
    rng.shuffle(facts)
    turns = [f"Note {k}: the {rng.choice(THINGS)} shipment to {rng.choice(CITIES)} is on schedule."
             for k in range(num_filler)]
    for fact in facts:  # early: within the first fifth of the conversation
        turns.insert(rng.randint(0, max(1, num_filler // 5)), fact)
    msgs = [{"role": "system", "content": "You are a helpful assistant."}]
    for text in turns:
        msgs += [{"role": "user", "content": text}, {"role": "assistant", "content": "Noted."}]
    return msgs + [{"role": "user", "content": QUESTION}], code


def pick_model(path: str | None) -> Path:
    if path:
        return Path(path)
    for name in LADDER:
        if (DEMO / name / "config.json").exists():
            return DEMO / name
    return DEMO / "target"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="model folder (default: a ladder model if present, else the demo target)")
    parser.add_argument("--num", type=int, default=20, help="conversations")
    parser.add_argument("--budget", type=int, default=512, help="prompt token budget (the model's context stand-in)")
    parser.add_argument("--filler", type=int, default=50, help="filler turns per conversation")
    parser.add_argument("--embedder", default="minilm", choices=("minilm", "lexical"))
    parser.add_argument("--distractors", type=int, default=2, choices=(0, 1, 2),
                        help="other codes stated next to the vault code (gym locker, bike lock)")
    parser.add_argument("--no-answers", action="store_true", help="retrieval accuracy only (no model runs)")
    parser.add_argument("--through-serve", action="store_true",
                        help="answers through a running tokenops serve and the openai SDK (see the module doc)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)  # on a shared 2-core box extra threads only spin (MiniLM calls got 10x slower)
    from tokenops_plugins.model_optimization.session_memory import SessionMemoryPlugin
    from tokenops.engine.core.tokenizer import Tokenizer
    from tokenops.memory.fit import ContextWindow, fit_conversation, message_text
    from tokenops.memory.memory_store import get_session_memory, set_session_memory
    from tokenops.types import GatewayRequest

    from tokenops.config import Settings as RealSettings

    def Settings():
        return RealSettings(plugins={"session_memory": {"enabled": True, "embedder": args.embedder,
                                                        "token_budget": args.budget}})

    model_dir = pick_model(args.model)
    tok = Tokenizer.from_dir(model_dir)

    def count(messages):
        plain = [{"role": m["role"], "content": message_text(m)} for m in messages]
        return len(tok.encode(tok.apply_chat_template(plain, add_generation_prompt=True), add_special_tokens=False))

    plugin = SessionMemoryPlugin()  # the instance a gateway would hold
    plugin.tokenops_configure(Settings())
    max_tokens = 8
    window = ContextWindow(None, count, True)
    rng = random.Random(0)
    rows = []
    embed_s = fit_s = 0.0
    memory = get_session_memory()
    for i in range(args.num):
        msgs, code = conversation(rng, args.filler, args.distractors)
        request = GatewayRequest(kind="chat", model="m", body={"messages": msgs, "max_tokens": max_tokens},
                                 messages=msgs, session_id=f"s{i}", tenant="bench")
        # the earlier requests of the session stored its turns (one new turn each, as a client
        # sends them); the last request then only embeds its question
        start = time.perf_counter()
        memory.remember("bench", f"s{i}", [(m["role"], m["content"]) for m in msgs[1:-1]])
        embed_s += time.perf_counter() - start
        start = time.perf_counter()
        info = plugin.tokenops_fit_context(request, window)
        fit_s += time.perf_counter() - start
        truncated, _ = fit_conversation(msgs, args.budget - max_tokens, count, [])
        rows.append({"code": code, "history_tokens": count(msgs), "memory": request.messages, "truncation": truncated,
                     "all": msgs,
                     "fitted": info.get("fitted")})
    set_session_memory(None)

    def has(messages, code):
        return any(re.search(rf"\bvault access code is {code}\b", message_text(m)) for m in messages)

    print(f"model {model_dir.name}, {args.num} conversations, history {min(r['history_tokens'] for r in rows)}-"
          f"{max(r['history_tokens'] for r in rows)} tokens, budget {args.budget} tokens "
          f"(prompt + {max_tokens} completion), embedder {args.embedder}\n"
          f"time per conversation: storing its {len(rows[0]['all']) - 2} turns {1000 * embed_s / args.num:.0f} ms "
          f"(spread over its requests in real use), fitting the last request {1000 * fit_s / args.num:.0f} ms")
    assert all(r["fitted"] for r in rows)
    assert all(count(r["memory"]) <= args.budget - max_tokens for r in rows)
    results = {}
    for way in ("truncation", "memory"):
        results[way] = {"retrieval": sum(has(r[way], r["code"]) for r in rows) / len(rows)}
        print(f"retrieval accuracy, {way}: {100 * results[way]['retrieval']:.0f}%", flush=True)
    if args.through_serve:
        served = through_serve(model_dir, rows, args.budget, max_tokens, args.embedder)
        results["refused"] = served.pop("refused")
        for way, res in served.items():
            results[way].update(res)
    elif not args.no_answers:
        from tokenops.engine.core.config import EngineConfig
        from tokenops.engine.core.engine import LLMEngine
        from tokenops.engine.sampling.sampling import SamplingParams

        engine = LLMEngine(EngineConfig(model=str(model_dir), device="cpu", max_model_len=max(args.budget, 256)))
        params = SamplingParams(temperature=0, max_tokens=max_tokens)
        for way in ("truncation", "memory"):
            prompts = [tok.encode(tok.apply_chat_template([{"role": m["role"], "content": message_text(m)} for m in r[way]],
                                                           add_generation_prompt=True), add_special_tokens=False)
                       for r in rows]
            outs = engine.generate(prompts, params)
            answers = [o.outputs[0].text for o in outs]
            results[way]["answer"] = sum(r["code"] in a for r, a in zip(rows, answers)) / len(rows)
            results[way]["example"] = answers[0].strip()[:40]
    if "refused" in results:
        print(f"whole history without a session: {results.pop('refused')} of {len(rows)} refused "
              f"(context_length_exceeded) by the server")
    print(f"\n{'':>12} {'prompt holds the fact':>22} {'answer correct':>15}  example answer")
    for way, res in results.items():
        answer = f"{100 * res['answer']:>14.0f}%" if "answer" in res else f"{'-':>15}"
        print(f"{way:>12} {100 * res['retrieval']:>21.0f}% {answer}  {res.get('example', '')!r}")


def through_serve(model_dir: Path, rows: list[dict], budget: int, max_tokens: int, embedder: str) -> dict:
    """Answer accuracy through a real ``tokenops serve`` driven by the openai SDK."""
    import tempfile

    import openai

    from tokenops.testing_serve import ServeProcess

    config = f"""
[[models]]
name = "m"
path = "{model_dir}"
engine = {{ max_model_len = {budget} }}

[plugins.session_memory]
enabled = true
embedder = "{embedder}"
"""
    out = {"truncation": {}, "memory": {}}
    with tempfile.TemporaryDirectory() as workdir, ServeProcess(Path(workdir), config=config, ready_timeout_s=300) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0, timeout=120)
        refused, answers = 0, {"truncation": [], "memory": []}
        for i, r in enumerate(rows):
            try:
                client.chat.completions.create(model="m", messages=r["all"], max_tokens=max_tokens, temperature=0)
            except openai.BadRequestError as e:
                refused += e.code == "context_length_exceeded"
            for way, messages, headers in (("truncation", r["truncation"], {}),
                                           ("memory", r["all"], {"x-session-id": f"serve-{i}"})):
                reply = client.chat.completions.create(model="m", messages=messages, max_tokens=max_tokens,
                                                       temperature=0, extra_headers=headers)
                answers[way].append(reply.choices[0].message.content or "")
    for way, texts in answers.items():
        out[way]["answer"] = sum(r["code"] in a for r, a in zip(rows, texts)) / len(rows)
        out[way]["example"] = texts[0].strip()[:40]
    out["refused"] = refused
    return out


if __name__ == "__main__":
    main()
