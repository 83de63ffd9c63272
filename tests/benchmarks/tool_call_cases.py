"""Generated tool-calling cases for tests/benchmarks/tool_calls.py (and the serve tests).

Four kinds, each case ``(kind, prompt, tools, expected)`` where ``expected`` is the list of
``(name, arguments)`` calls a right answer makes (empty: no tool should be called):

- ``obvious``: one tool, a request that plainly needs it;
- ``choose``: three or four tools, the request needs one of them;
- ``parallel``: the request needs two calls (``parallel_tool_calls: true``);
- ``irrelevance``: tools are offered, the request needs none of them.

Values are drawn from fixed lists with a seeded RNG, so a run is repeatable.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Berlin", "Madrid", "Toronto", "Sydney", "Nairobi"]
CURRENCIES = ["USD", "EUR", "JPY", "GBP", "CHF"]
SYMBOLS = ["AAPL", "MSFT", "GOOG", "TSLA", "AMZN"]
LANGUAGES = ["French", "German", "Spanish", "Italian", "Japanese"]
#: what ``translate`` wants (its schema says so): the ISO 639-1 code, as a model writing "es" for
#: "Spanish" does (before s19 the expected value was the English name, which counted those answers wrong)
ISO_639_1 = {"French": "fr", "German": "de", "Spanish": "es", "Italian": "it", "Japanese": "ja"}
WORDS = ["hello", "thank you", "good night", "water", "friend"]


def _fn(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": list(properties)},
        },
    }


TOOLS = {
    "get_weather": _fn("get_weather", "Get the current weather in a city", {"city": {"type": "string"}}),
    "add": _fn("add", "Add two numbers", {"a": {"type": "number"}, "b": {"type": "number"}}),
    "get_stock_price": _fn(
        "get_stock_price", "Get the latest price of a stock by its ticker symbol", {"symbol": {"type": "string"}}
    ),
    "convert_currency": _fn(
        "convert_currency",
        "Convert an amount of money from one currency to another",
        {"amount": {"type": "number"}, "from_currency": {"type": "string"}, "to_currency": {"type": "string"}},
    ),
    "translate": _fn(
        "translate",
        "Translate a text into another language",
        {
            "text": {"type": "string"},
            "language": {"type": "string", "description": "the target language's ISO 639-1 code, such as 'es'"},
        },
    ),
    "set_timer": _fn("set_timer", "Set a timer for a number of minutes", {"minutes": {"type": "integer"}}),
}


@dataclass(slots=True)
class ToolCase:
    kind: str
    prompt: str
    tools: list[dict[str, Any]]
    expected: list[tuple[str, dict[str, Any]]]


def _request(rng: random.Random) -> tuple[str, str, dict[str, Any]]:
    """(prompt, tool name, arguments) of one request that needs one tool."""
    tool = rng.choice(list(TOOLS))
    if tool == "get_weather":
        city = rng.choice(CITIES)
        prompt = rng.choice(
            ["What's the weather in {c}?", "Is it raining in {c} right now?", "How warm is it in {c} today?"]
        )
        return prompt.format(c=city), tool, {"city": city}
    if tool == "add":
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        prompt = rng.choice(["What is {a} plus {b}?", "Add {a} and {b}.", "Compute the sum of {a} and {b}."])
        return prompt.format(a=a, b=b), tool, {"a": a, "b": b}
    if tool == "get_stock_price":
        symbol = rng.choice(SYMBOLS)
        return (
            rng.choice(["What is the stock price of {s}?", "How much is {s} stock trading at?"]).format(s=symbol),
            tool,
            {"symbol": symbol},
        )
    if tool == "convert_currency":
        amount, src, dst = rng.randint(5, 500), *rng.sample(CURRENCIES, 2)
        prompt = f"Convert {amount} {src} to {dst}."
        return prompt, tool, {"amount": amount, "from_currency": src, "to_currency": dst}
    if tool == "translate":
        word, language = rng.choice(WORDS), rng.choice(LANGUAGES)
        return f"Translate '{word}' into {language}.", tool, {"text": word, "language": ISO_639_1[language]}
    minutes = rng.randint(2, 60)
    return (
        rng.choice(["Set a timer for {m} minutes.", "Start a {m} minute timer."]).format(m=minutes),
        tool,
        {"minutes": minutes},
    )


IRRELEVANT = [
    "Hello! How are you?",
    "Tell me a joke.",
    "Write a haiku about the sea.",
    "Who wrote Hamlet?",
    "Thanks, that's all for today.",
    "What is the capital of Italy?",
    "Give me a tip for sleeping better.",
    "What does a cat say?",
    "Good morning!",
    "Describe the color blue in one sentence.",
    "Who painted the Mona Lisa?",
    "Say something nice.",
    "What is your name?",
    "Recommend a good book.",
    "How do plants grow?",
    "Why is the sky blue?",
    "What should I cook for dinner?",
    "Tell me a fun fact about whales.",
    "Can you write a short poem about autumn?",
    "What is love?",
]


def generate(num_per_kind: int = 50, seed: int = 0) -> list[ToolCase]:
    """``num_per_kind`` cases of each kind (``4 * num_per_kind`` in all)."""
    rng = random.Random(seed)
    cases: list[ToolCase] = []
    for _ in range(num_per_kind):
        prompt, name, args = _request(rng)
        cases.append(ToolCase("obvious", prompt, [TOOLS[name]], [(name, args)]))
    for _ in range(num_per_kind):
        prompt, name, args = _request(rng)
        others = rng.sample([t for t in TOOLS if t != name], rng.choice([2, 3]))
        offered = [TOOLS[t] for t in rng.sample([name, *others], len(others) + 1)]
        cases.append(ToolCase("choose", prompt, offered, [(name, args)]))
    for _ in range(num_per_kind):
        (p1, n1, a1), (p2, n2, a2) = _request(rng), _request(rng)
        prompt = f"{p1} Also: {p2[0].lower()}{p2[1:]}"
        offered = [TOOLS[n] for n in dict.fromkeys([n1, n2])]
        cases.append(ToolCase("parallel", prompt, offered, [(n1, a1), (n2, a2)]))
    for i in range(num_per_kind):
        prompt = IRRELEVANT[i % len(IRRELEVANT)]
        offered = [TOOLS[t] for t in rng.sample(list(TOOLS), rng.choice([1, 2, 3]))]
        cases.append(ToolCase("irrelevance", prompt, offered, []))
    return cases
