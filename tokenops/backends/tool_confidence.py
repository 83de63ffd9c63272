"""The confidence gate for free tool calls (``tool_choice`` auto) on the bundled engine.

A model offered tools sometimes answers a question that needs none with a made-up call (Qwen2.5-Coder
greeted with "Hello!" beside a weather tool asks for the weather in New York). Such calls are
schema-valid, but the model is unsure of them: measured through serve, the function name's tokens
and the first token of each argument value have probability 0.23-0.77 in made-up calls and
0.99-1.0 in calls the user asked for (docs/serve.md, "Tool calls", has the figures).

:class:`CallConfidence` keeps one choice's generated tokens with their chosen-token probabilities
(the engine reports them when the gate is on; the client sees logprobs only if it asked) and gives a
call's confidence: the lowest probability among the tokens that spell its name and the first token
of each top-level argument value (where the model commits to a value; later tokens of a long value,
such as a file's text, are not counted). A call under ``[[models]] tool_call_min_confidence`` is not
returned, nor (with the gate on) a free call of a function not offered or with arguments its schema
refuses, which would otherwise stay in the answer as raw JSON text: the backend answers again with the call opening excluded (:func:`text_only_grammar`), so
the client gets a text answer and nothing of the rejected call. Forced calls (``required``, a named
function) are never gated: the user asked for a call.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

#: The default ``[[models]] tool_call_min_confidence`` (see the module docstring and docs/serve.md).
DEFAULT_MIN_CONFIDENCE = 0.9


@dataclass
class CallConfidence:
    """One choice's generated text as tokens with their probabilities, and the calls judged so far."""

    threshold: float
    text: str = ""
    #: (start, end, probability) of each token in :attr:`text`
    spans: list[tuple[int, int, float]] = field(default_factory=list)
    cursor: int = 0  # where the next call's name is looked for
    judged: list[dict[str, Any]] = field(default_factory=list)  # {"name", "confidence", "gated"} per call

    def add(self, entries: list[dict[str, Any]]) -> None:
        """Record engine logprob entries (``token``, ``logprob``) in order."""
        for e in entries:
            piece = str(e.get("token") or "")
            lp = e.get("logprob")
            p = math.exp(lp) if isinstance(lp, (int, float)) and lp > -1e30 else 0.0
            self.spans.append((len(self.text), len(self.text) + len(piece), p))
            self.text += piece

    def confidence(self, name: str, arguments: str) -> float | None:
        """The call's confidence (see the module docstring), or None when its name cannot be found in
        the tokens (the call is then not judged)."""
        at = self.text.find(json.dumps(name), self.cursor)
        if at < 0:
            return None
        name_end = at + len(json.dumps(name))
        probs = self._probs(at + 1, name_end - 1)
        self.cursor = name_end
        try:
            args = json.loads(arguments)
        except ValueError:
            args = {}
        for key in args if isinstance(args, dict) else {}:
            m = re.compile(re.escape(json.dumps(key)) + r'\s*:\s*"?').search(self.text, self.cursor)
            if m is None:
                continue
            probs += self._probs(m.end(), m.end() + 1)
            self.cursor = m.end()
        return min(probs) if probs else None

    def passes(self, name: str, arguments: str, valid: bool = True) -> bool:
        """Whether the call may be returned (and record the judgement). ``valid``: whether it calls an
        offered function with arguments its schema admits; an invalid one is gated whatever its confidence
        (answered again in text rather than left in the answer as raw JSON)."""
        conf = self.confidence(name, arguments)
        gated = not valid or (conf is not None and not gate_rule([conf], self.threshold))
        judged = {"name": name, "confidence": None if conf is None else round(conf, 4), "gated": gated}
        self.judged.append(judged if valid else {**judged, "offered": False})
        return not gated

    def _probs(self, start: int, end: int) -> list[float]:
        """The probabilities of the tokens that overlap ``text[start:end]``."""
        return [p for s, e, p in self.spans if s < end and e > start]


def min_confidence(configured: float | None, parser_name: str) -> float:
    """The gate's threshold for a model: ``[[models]] tool_call_min_confidence`` when set, else
    :data:`DEFAULT_MIN_CONFIDENCE` for a native format and 0 (off) for the generic one, whose grammar
    makes the model choose between a call and a reply at the name, with probabilities on another
    scale (SmolLM2-135M's right calls go down to 0.35: docs/serve.md)."""
    if configured is not None:
        return float(configured)
    return 0.0 if parser_name == "generic" else DEFAULT_MIN_CONFIDENCE


def gate_rule(probabilities: list[float], threshold: float) -> bool:
    """Whether a call whose judged tokens have ``probabilities`` is returned (the rule above)."""
    return not probabilities or min(probabilities) >= threshold


def text_only_grammar(parser_name: str, parser: Any) -> Any:
    """A grammar for the answer again after a gated call: text that cannot open a call. The generic
    format has its own no-call reply; a native format gets any text that does not start with what a
    call starts with (``{``, ``[``, a code fence, a tag); special tokens such as ``<tool_call>`` are
    outside a Lark text rule anyway."""
    from tokenops.backends.generic_tool_calls import TEXT_REPLY
    from tokenops.engine.sampling.grammar import GrammarSpec

    if parser_name == "generic":
        return GrammarSpec("lark", parser.grammar([], parallel=False, answer=TEXT_REPLY), "")
    return GrammarSpec("lark", "start: /\\s*[^\\s{\\[<`](.|\\n)*/\n", "")
