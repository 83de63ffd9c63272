"""Ensembles, opt-in per request through model aliases:

- ``ensemble:vote`` — self-consistency: ``samples`` answers (sampled at ``temperature``)
  from the first member; the majority answer wins (numbers compared by value, text by words);
- ``ensemble:best_of_n`` — one answer from each member; the ``judge`` model picks the best;
- ``ensemble:moa`` — mixture of agents: every member proposes, the ``aggregator`` model
  writes the final answer from the proposals.

```toml
[plugins.ensemble]
members = ["small", "big"]
samples = 5
temperature = 0.8
judge = "big"
aggregator = "big"
```

Members appear in the request's telemetry (``ensemble_members``). Streaming requests
get the combined answer streamed once it is known.
"""

from __future__ import annotations

import re
from collections import Counter

from tokenops import hookimpl
from tokenops.types import EnsembleFollowUp, GatewayResponse, RouteDecision

from .validators import normalise_answer

TOKENOPS_LAYER = "multi_model"
#: The [plugins.<section>] tables this plugin reads and their keys: serve and tune refuse any other.
TOKENOPS_SETTINGS = {"ensemble": ("members", "samples", "temperature", "judge", "aggregator")}
METHODS = ("vote", "best_of_n", "moa")

_DEFAULTS: dict = {"members": [], "samples": 5, "temperature": 0.8, "judge": None, "aggregator": None}


def majority(responses: list[GatewayResponse]) -> GatewayResponse:
    keys = [normalise_answer(r.text) for r in responses]
    winner, votes = Counter(keys).most_common(1)[0]
    chosen = responses[keys.index(winner)]
    chosen.extra["votes"] = {"winner": votes, "of": len(responses)}
    chosen.extra["samples"] = [r.text for r in responses]
    return chosen


def judge_prompt(question: str, responses: list[GatewayResponse]) -> list[dict]:
    listing = "\n\n".join(f"[{i + 1}] {r.text}" for i, r in enumerate(responses))
    return [
        {
            "role": "user",
            "content": f"Question:\n{question}\n\nCandidate answers:\n{listing}\n\n"
            f"Which candidate answers the question best? Reply with its number only.",
        }
    ]


def pick_judged(responses: list[GatewayResponse], verdict: str) -> GatewayResponse:
    numbers = [int(n) for n in re.findall(r"\d+", verdict) if 1 <= int(n) <= len(responses)]
    chosen = responses[numbers[0] - 1] if numbers else max(responses, key=lambda r: len(r.text))
    chosen.extra["judge"] = {"verdict": verdict.strip()[:100], "picked": responses.index(chosen) + 1}
    return chosen


def aggregate_prompt(question: str, responses: list[GatewayResponse]) -> list[dict]:
    listing = "\n\n".join(f"Proposal {i + 1}: {r.text}" for i, r in enumerate(responses))
    return [
        {
            "role": "user",
            "content": f"{question}\n\nHere are proposed answers from other assistants:\n{listing}\n\n"
            f"Write the single best answer, correcting any mistakes.",
        }
    ]


class Ensemble:
    """One gateway's ensemble members, sampling and judge/aggregator models."""

    TOKENOPS_LAYER = TOKENOPS_LAYER
    TOKENOPS_SETTINGS = TOKENOPS_SETTINGS

    def __init__(self) -> None:
        self.conf: dict = dict(_DEFAULTS)

    @hookimpl
    def tokenops_configure(self, settings):
        conf = settings.plugin_settings("ensemble")
        for key in self.conf:
            if key in conf:
                self.conf[key] = conf[key]

    @hookimpl(tryfirst=True)
    def tokenops_route(self, request, candidates, profiles):
        if not request.model.startswith("ensemble:"):
            return None
        method = request.model.split(":", 1)[1]
        if method not in METHODS:
            raise ValueError(
                f"unknown ensemble {request.model!r}; use one of " + ", ".join(f"ensemble:{m}" for m in METHODS)
            )
        members = [m for m in self.conf["members"] if m in candidates]
        if not members:
            raise ValueError("[plugins.ensemble] members lists no configured model")
        if method == "vote":
            members = [members[0]] * int(self.conf["samples"])
            # Self-consistency needs diverse samples: sample unless the client chose a temperature.
            if not request.sampling.temperature:
                request.override_sampling(temperature=float(self.conf["temperature"]), seed=None)
            else:
                request.override_sampling(seed=None)
        return RouteDecision(
            members[0],
            f"ensemble: {method} over {len(members)}",
            router="ensemble",
            members=tuple(members),
            method=method,
        )

    @hookimpl(trylast=True)
    def tokenops_ensemble(self, request, responses):
        method = request.model.split(":", 1)[1] if request.model.startswith("ensemble:") else "vote"
        if method == "vote":
            return majority(responses)
        question = request.prompt_text()
        usage = (sum(r.prompt_tokens for r in responses), sum(r.completion_tokens for r in responses))

        def billed(final: GatewayResponse, follow_up: GatewayResponse) -> GatewayResponse:
            """Usage of every member plus the judge's or aggregator's own call."""
            final.prompt_tokens = usage[0] + follow_up.prompt_tokens
            final.completion_tokens = usage[1] + follow_up.completion_tokens
            return final

        if method == "best_of_n":
            judge = self.conf["judge"] or responses[-1].model
            return EnsembleFollowUp(
                judge,
                judge_prompt(question, responses),
                lambda verdict: billed(pick_judged(responses, verdict.text), verdict),
                8,
            )
        aggregator = self.conf["aggregator"] or responses[-1].model
        # the final answer is the aggregator's: it gets the client's token limit (members already had it)
        asked = request.max_tokens if request.sampling.is_max_tokens_sent else None
        return EnsembleFollowUp(
            aggregator,
            aggregate_prompt(question, responses),
            lambda answer: billed(answer, answer),
            asked if asked else 256,
        )
