"""Training-only retrieval pairs over long contexts: teach a ladder model to copy a fact
out of a prompt of up to ~500 tokens, wherever and however the fact appears.

The suites' retrieval task (held out, seed 0) puts one fact among 8 notes in a single user
message (~180 tokens). Real long conversations — and the prompts session memory builds —
are longer and shaped differently: many turns, the fact in an early user turn, or recalled
into a system message ahead of the newest turns. These pairs cover those shapes with
1-3 facts of different keys (mostly 3: distractors), 0-30 filler notes and 4 layouts:

- ``single``: one user message of notes, then the question;
- ``turns``: the notes as user turns answered "Noted.", the question as the last turn;
- ``recalled``: a system message listing recalled lines (``- user: ...``, under one of a
  few headers, the one tokenops' session memory writes among them) followed by filler turns;
- ``system``: the facts in the system prompt, filler turns after.

The answer is the number with a leading space, so its tokens are the tokens that follow
"is" in the context (the demo tokenizer splits " 4821" and "4821" differently): a copy.
Pairs longer than the caller's token limit are dropped (never cut: a cut prompt could lose
the fact and teach guessing).
"""

from __future__ import annotations

import random
from typing import Callable

from task_training import _FILLER_CITIES, _FILLER_THINGS, _KEYS

# the short generator's lists (task_training.recall_pair), extended: same order, so the data
# these phases were trained on is reproduced exactly
KEYS = _KEYS + ["flight number", "room number", "invoice number", "ticket number"]
THINGS = _FILLER_THINGS + ["wool", "rice", "salt"]
CITIES = _FILLER_CITIES + ["Cairo", "Leeds"]
LEADS = ["Important: the", "By the way, the", "Also, the", "Remember: the", "The", "Also, my", "Note that my"]
HEADERS = ["Earlier in this conversation (recalled from session memory):", "Notes from earlier:",
           "Recalled context:", "Things the user said before:"]
LAYOUTS = ("single", "turns", "recalled", "system")


def _filler(rng: random.Random, i: int) -> str:
    if rng.random() < 0.7:
        return f"Note {i}: the {rng.choice(THINGS)} shipment to {rng.choice(CITIES)} is on schedule."
    return f"Describe the harbour on day {i}: the boats, the gulls and the tide."


def long_recall_pair(rng: random.Random) -> tuple[str, list[dict], str]:
    keys = rng.sample(KEYS, rng.choice((1, 2, 3, 3)))  # mostly with distractor facts
    codes = [rng.randint(1000, 9999) for _ in keys]
    facts = [f"{rng.choice(LEADS)} {k} is {c}." for k, c in zip(keys, codes)]
    ask = rng.randrange(len(keys))
    question = f"What is the {keys[ask]}? Reply with the number only."
    layout = rng.choice(LAYOUTS)
    system = [{"role": "system", "content": "You are a helpful assistant."}] if rng.random() < 0.5 else []

    def turns(lines: list[str]) -> list[dict]:
        out: list[dict] = []
        for line in lines:
            out += [{"role": "user", "content": line}, {"role": "assistant", "content": "Noted."}]
        return out

    if layout == "single":
        notes = [_filler(rng, i) for i in range(rng.randint(0, 30))]
        for fact in facts:
            notes.insert(rng.randint(0, len(notes)), fact)
        messages = system + [{"role": "user", "content": "\n".join(notes) + "\n\n" + question}]
    elif layout == "turns":
        notes = [_filler(rng, i) for i in range(rng.randint(0, 14))]
        for fact in facts:
            notes.insert(rng.randint(0, min(len(notes), 3)), fact)  # early, as in a long chat
        messages = system + turns(notes) + [{"role": "user", "content": question}]
    elif layout == "recalled":
        lines = [f"- user: {f}" for f in facts] + [f"- user: {_filler(rng, i)}" for i in range(rng.randint(0, 12))]
        lines += ["- assistant: Noted."] * rng.randint(0, 2)
        rng.shuffle(lines)
        recalled = {"role": "system", "content": "\n".join([rng.choice(HEADERS)] + lines)}
        filler = turns([_filler(rng, 100 + i) for i in range(rng.randint(0, 12))])
        messages = system + [recalled] + filler + [{"role": "user", "content": question}]
    else:  # system
        prompt = "You are a helpful assistant. " + " ".join(facts)
        filler = turns([_filler(rng, i) for i in range(rng.randint(0, 12))])
        messages = [{"role": "system", "content": prompt}] + filler + [{"role": "user", "content": question}]
    return "retrieval", messages, f" {codes[ask]}"


def long_recall_pairs(num: int, seed: int, fits: Callable[[list[dict]], bool]) -> list[tuple[str, list[dict], str]]:
    """``num`` pairs whose prompt ``fits`` (the caller's token limit)."""
    rng = random.Random(f"long-recall:{seed}")
    out = []
    while len(out) < num:
        pair = long_recall_pair(rng)
        if fits(pair[1]):
            out.append(pair)
    return out
