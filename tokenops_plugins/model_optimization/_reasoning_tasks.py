"""Checkable multi-step tasks whose worked solution grows with difficulty.

The demo reasoning model (``scripts/train_reasoning.py``) learns to write
``<think>`` worked steps ``</think>`` then the answer on these; the reasoning-budget
benchmark and tests measure on held-out seeds. Difficulty is the number of terms, so a
harder item needs more thinking lines. Numbers stay within what the demo tokenizer
holds as single tokens (0..50 written without a space), which keeps each step one
small lookup for a small model.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

REASONING_DIMENSIONS = ("multistep", "maxof")
MIN_TERMS, MAX_TERMS = 2, 6
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
REFLECTION = "Wait, check:"


@dataclass(slots=True, frozen=True)
class ReasoningTask:
    id: str
    dimension: str
    prompt: str
    reference: str  # the answer
    difficulty: int  # number of terms
    lines: tuple[str, ...]  # one worked pass, first line restates the input

    def check(self, answer: str) -> bool:
        """Correct when the last number of the answer (thinking removed) is the reference."""
        answer = answer.split(THINK_CLOSE)[-1]
        return re.findall(r"-?\d+", answer)[-1:] == [self.reference]

    def thinking(self, reflect: bool) -> str:
        """The worked steps; with ``reflect`` a second, checking pass follows a reflection line."""
        body = "\n".join(self.lines)
        return body + (f"\n{REFLECTION}\n{body}" if reflect else "")

    def completion(self, reflect: bool) -> str:
        """The whole assistant turn the model is trained on."""
        return f"{THINK_OPEN}\n{self.thinking(reflect)}\n{THINK_CLOSE}\n{self.reference}"


def multistep_task(rng: random.Random, i: int, terms: int) -> ReasoningTask:
    values, ops = [rng.randint(1, 9)], []
    total = values[0]
    for _ in range(terms - 1):
        x = rng.randint(1, 9)
        op = rng.choice("+-")
        if op == "-" and total - x < 0 or op == "+" and total + x > 50:
            op = "+" if op == "-" else "-"
        total = total + x if op == "+" else total - x
        values.append(x)
        ops.append(op)
    lines, current = [], list(values)
    rest_ops = list(ops)
    expr = lambda vals, os_: str(vals[0]) + "".join(o + str(v) for o, v in zip(os_, vals[1:]))  # noqa: E731
    lines.append(expr(current, rest_ops))
    while len(current) > 1:
        first = current[0] + current[1] if rest_ops[0] == "+" else current[0] - current[1]
        current, rest_ops = [first] + current[2:], rest_ops[1:]
        lines.append("=" + expr(current, rest_ops))
    text = " ".join([str(values[0])] + [f"{o} {v}" for o, v in zip(ops, values[1:])])
    prompt = f"Compute {text}. Reply with the number only."
    return ReasoningTask(f"multistep-{i}", "multistep", prompt, str(total), terms, tuple(lines))


def maxof_task(rng: random.Random, i: int, terms: int) -> ReasoningTask:
    values = [rng.randint(10, 50) for _ in range(terms)]
    lines, current = [",".join(map(str, values))], list(values)
    while len(current) > 1:
        current = [max(current[0], current[1])] + current[2:]
        lines.append("=" + ",".join(map(str, current)))
    prompt = f"Which is the largest of {', '.join(map(str, values))}? Reply with the number only."
    return ReasoningTask(f"maxof-{i}", "maxof", prompt, str(max(values)), terms, tuple(lines))


GENERATORS = {"multistep": multistep_task, "maxof": maxof_task}


def make_reasoning_suite(
    dimension: str, n: int, seed: int = 0, terms: tuple[int, int] = (MIN_TERMS, MAX_TERMS)
) -> list[ReasoningTask]:
    """``n`` tasks of ``dimension`` with a term count drawn uniformly from ``terms`` (inclusive)."""
    if dimension not in GENERATORS:
        raise ValueError(f"unknown reasoning suite {dimension!r}; choose from {', '.join(REASONING_DIMENSIONS)}")
    rng = random.Random(f"reasoning:{dimension}:{seed}")
    return [GENERATORS[dimension](rng, i, rng.randint(*terms)) for i in range(n)]


def make_reasoning_mixed(n_per_dimension: int, seed: int = 0) -> list[ReasoningTask]:
    tasks = [t for d in REASONING_DIMENSIONS for t in make_reasoning_suite(d, n_per_dimension, seed)]
    random.Random(seed).shuffle(tasks)
    return tasks
