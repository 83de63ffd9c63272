"""Task suites whose answers code can check, one generator per capability dimension.

Every task is generated from a seeded RNG (no data files, nothing downloaded) and has
a ``check(answer) -> bool`` that decides correctness from the model's text alone.
Used by ``tokenops profile run`` (capability profiles), by the profile router's dimension
classifier (as labelled examples) and by ``tests/benchmarks/routing_eval.py``.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

DIMENSIONS = ("math", "extraction", "instruction", "retrieval", "code", "classification")


@dataclass(slots=True, frozen=True)
class Task:
    id: str
    dimension: str
    prompt: str
    check: Callable[[str], bool]
    reference: str  # a correct answer (lets tests prove each checker can pass)


def _numbers(text: str) -> list[str]:
    return re.findall(r"-?\d+(?:\.\d+)?", text.replace(",", ""))


def math_task(rng: random.Random, i: int) -> Task:
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(1, 50)
    op = rng.choice(["+", "-", "*"])
    value = {"+": a + b, "-": a - b, "*": a * b}[op] + c
    prompt = f"Compute ({a} {op} {b}) + {c}. Reply with the number only."
    return Task(f"math-{i}", "math", prompt, lambda ans: _numbers(ans)[-1:] == [str(value)], str(value))


_NAMES = ["Alice", "Bruno", "Chen", "Dana", "Emeka", "Farah", "Goran", "Hana", "Ivan", "Jun"]
_CITIES = ["Paris", "Lagos", "Osaka", "Lima", "Oslo", "Pune", "Quito", "Riga", "Sofia", "Turin"]


def extraction_task(rng: random.Random, i: int) -> Task:
    name, city, age = rng.choice(_NAMES), rng.choice(_CITIES), rng.randint(18, 90)
    text = f"{name} moved to {city} last spring and turned {age} in May."
    prompt = f'Extract a JSON object with keys "name", "city" and "age" (integer) from: "{text}" Reply with JSON only.'
    want = {"name": name, "city": city, "age": age}

    def check(ans: str, want=want) -> bool:
        m = re.search(r"\{.*\}", ans, re.S)
        try:
            got = json.loads(m.group(0)) if m else None
        except ValueError:
            return False
        return isinstance(got, dict) and {k: got.get(k) for k in want} == want

    return Task(f"extraction-{i}", "extraction", prompt, check, json.dumps(want))


_WORDS = [
    "river",
    "stone",
    "cloud",
    "ember",
    "maple",
    "violet",
    "copper",
    "harbor",
    "lantern",
    "meadow",
    "garden",
    "silver",
    "winter",
    "forest",
    "candle",
    "pepper",
    "marble",
    "thunder",
    "willow",
    "orbit",
]


def instruction_task(rng: random.Random, i: int) -> Task:
    n = rng.randint(3, 7)
    case = rng.choice(["lowercase", "uppercase"])
    start = rng.choice(_WORDS)
    prompt = f"Write exactly {n} words, all in {case}, and make the first word '{start}'. No punctuation."

    def check(ans: str, n=n, case=case, start=start) -> bool:
        words = ans.strip().split()
        ok_case = all(w == (w.lower() if case == "lowercase" else w.upper()) for w in words)
        return len(words) == n and ok_case and bool(words) and words[0].lower() == start and words[0].isalpha()

    ref_words = [start] + rng.sample(_WORDS, n - 1)
    ref = " ".join(w.lower() if case == "lowercase" else w.upper() for w in ref_words)
    return Task(f"instruction-{i}", "instruction", prompt, check, ref)


def retrieval_task(rng: random.Random, i: int, num_filler: int = 8) -> Task:
    code = rng.randint(1000, 9999)
    filler = [
        f"Note {k}: the {rng.choice(_WORDS)} shipment to {rng.choice(_CITIES)} is on schedule."
        for k in range(num_filler)
    ]
    filler.insert(rng.randint(0, num_filler), f"Important: the vault access code is {code}.")
    prompt = "\n".join(filler) + "\n\nWhat is the vault access code? Reply with the number only."
    return Task(f"retrieval-{i}", "retrieval", prompt, lambda ans: str(code) in _numbers(ans), str(code))


_CODE_SPECS = [
    (
        "add",
        "returns the sum of a and b",
        "def add(a, b):\n    return a + b",
        "assert add(2, 3) == 5 and add(-1, 1) == 0",
    ),
    (
        "is_even",
        "returns True when n is even",
        "def is_even(n):\n    return n % 2 == 0",
        "assert is_even(4) and not is_even(7)",
    ),
    (
        "rev",
        "returns the string s reversed",
        "def rev(s):\n    return s[::-1]",
        "assert rev('abc') == 'cba' and rev('') == ''",
    ),
    (
        "maximum",
        "returns the largest item of a non-empty list xs",
        "def maximum(xs):\n    return max(xs)",
        "assert maximum([3, 9, 2]) == 9 and maximum([-5]) == -5",
    ),
    (
        "count_vowels",
        "returns how many vowels (aeiou) the string s has",
        "def count_vowels(s):\n    return sum(c in 'aeiou' for c in s)",
        "assert count_vowels('banana') == 3 and count_vowels('xyz') == 0",
    ),
]


def run_python_tests(code: str, tests: str, timeout_s: float = 5.0) -> bool:
    """Run model-written code and its tests in an isolated subprocess."""
    m = re.search(r"```(?:python)?\n(.*?)```", code, re.S)
    source = (m.group(1) if m else code) + "\n" + tests + "\n"
    try:
        out = subprocess.run([sys.executable, "-I", "-c", source], capture_output=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return False
    return out.returncode == 0


# Parametrised specs (two numbers to carry from the request into the code) make the
# code dimension more than recalling five fixed functions.
_CODE_TEMPLATES = [
    (
        "scale",
        "returns x times {a} plus {b}",
        "def scale(x):\n    return x * {a} + {b}",
        lambda a, b: f"assert scale(0) == {b} and scale(3) == {3 * a + b}",
    ),
    (
        "shift",
        "returns x minus {a} times {b}",
        "def shift(x):\n    return x - {a} * {b}",
        lambda a, b: f"assert shift(0) == {-a * b} and shift(10) == {10 - a * b}",
    ),
    (
        "clip",
        "returns x limited to the range {a} to {c}",
        "def clip(x):\n    return min(max(x, {a}), {c})",
        lambda a, b: f"assert clip(-100) == {a} and clip(100) == {a + b + 10} and clip({a + 1}) == {a + 1}",
    ),
    (
        "count_over",
        "returns how many items of the list xs are greater than {a}",
        "def count_over(xs):\n    return sum(1 for x in xs if x > {a})",
        lambda a, b: f"assert count_over([{a - 1}, {a}, {a + 1}, {a + b}]) == 2 and count_over([]) == 0",
    ),
    (
        "repeat",
        "returns the string s repeated {a} times",
        "def repeat(s):\n    return s * {a}",
        lambda a, b: f"assert repeat('ab') == 'ab' * {a} and repeat('') == ''",
    ),
]


def code_task(rng: random.Random, i: int) -> Task:
    if rng.random() < 0.75:
        name, spec, ref, make_tests = rng.choice(_CODE_TEMPLATES)
        a, b = rng.randint(2, 19), rng.randint(1, 19)
        values = {"a": a, "b": b, "c": a + b + 10}
        spec, ref, tests = spec.format(**values), ref.format(**values), make_tests(a, b)
    else:
        name, spec, ref, tests = rng.choice(_CODE_SPECS)
    prompt = f"Write a Python function `{name}` that {spec}. Reply with the code only."
    return Task(f"code-{i}", "code", prompt, lambda ans: run_python_tests(ans, tests), ref)


_POS = [
    "loved",
    "enjoyed",
    "was delighted by",
    "would happily recommend",
    "was impressed by",
    "adored",
    "was thrilled with",
    "really liked",
    "was pleased with",
    "had a great time with",
]
_NEG = [
    "hated",
    "regretted buying",
    "was disappointed by",
    "would never recommend",
    "was annoyed by",
    "disliked",
    "was frustrated by",
    "could not stand",
    "was let down by",
    "had a terrible time with",
]
_ITEMS = [
    "the hotel",
    "this phone",
    "the concert",
    "the new update",
    "their service",
    "the restaurant",
    "this laptop",
    "the movie",
    "the delivery",
    "the museum",
]
_OPENERS = ["", "Honestly, ", "Last week ", "Overall, ", "To be fair, "]


def classification_task(rng: random.Random, i: int) -> Task:
    label = rng.choice(["positive", "negative"])
    verb = rng.choice(_POS if label == "positive" else _NEG)
    opener = rng.choice(_OPENERS)
    sentence = f"{opener}I {verb} {rng.choice(_ITEMS)}."
    prompt = f'Classify the sentiment of this review as positive or negative: "{sentence}" Reply with one word.'

    def check(ans: str, label=label) -> bool:
        words = re.findall(r"[a-z]+", ans.lower())
        return label in words and ({"positive", "negative"} - {label}).isdisjoint(words)

    return Task(f"classification-{i}", "classification", prompt, check, label)


GENERATORS: dict[str, Callable[[random.Random, int], Task]] = {
    "math": math_task,
    "extraction": extraction_task,
    "instruction": instruction_task,
    "retrieval": retrieval_task,
    "code": code_task,
    "classification": classification_task,
}


def make_suite(dimension: str, n: int, seed: int = 0) -> list[Task]:
    if dimension not in GENERATORS:
        raise ValueError(f"unknown suite {dimension!r}; choose from {', '.join(DIMENSIONS)}")
    rng = random.Random(f"{dimension}:{seed}")
    return [GENERATORS[dimension](rng, i) for i in range(n)]


def make_mixed(n_per_dimension: int, seed: int = 0, dimensions: tuple[str, ...] = DIMENSIONS) -> list[Task]:
    tasks = [t for d in dimensions for t in make_suite(d, n_per_dimension, seed)]
    random.Random(seed).shuffle(tasks)
    return tasks
