"""Reasoning parsers: split a model's thinking from its answer.

A model that thinks before answering writes ``<think>`` … ``</think>`` and then the
answer (DeepSeek-R1, Qwen3, the demo ``reasoning-small``). The bundled engine's adapter
sends the thinking as ``reasoning_content`` and the rest as ``content``, in responses and
stream deltas, as DeepSeek's API and vLLM's ``--reasoning-parser`` do. Chosen per model
with ``[[models]] reasoning_parser = "think"``; unset, the text is left as it is.

:class:`ReasoningSplitter` works on streamed text pieces: it holds back a piece that may
be the start of a tag until the next piece decides, so a tag split across tokens never
leaks into either field. One line break right after each tag and right before the
closing tag belongs to the markup and is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class ReasoningParser:
    name: str
    open_tag: str
    close_tag: str


PARSERS: dict[str, ReasoningParser] = {
    "think": ReasoningParser("think", "<think>", "</think>"),
    # vLLM's names for the same markup
    "deepseek_r1": ReasoningParser("deepseek_r1", "<think>", "</think>"),
    "qwen3": ReasoningParser("qwen3", "<think>", "</think>"),
}


def get_reasoning_parser(name: str | None) -> ReasoningParser | None:
    """The parser called ``name`` (None: no parser); an unknown name is a ValueError."""
    if name is None or name == "":
        return None
    try:
        return PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown reasoning_parser {name!r}; choose from {', '.join(PARSERS)}") from None


class ReasoningSplitter:
    """Streamed text -> (reasoning piece, content piece) for one choice."""

    def __init__(self, parser: ReasoningParser, starts_thinking: bool = False) -> None:
        self.parser = parser
        # before: the block may still open; thinking: inside; after: the answer
        self.state = "thinking" if starts_thinking else "before"
        self._held = ""
        self._strip_newline = starts_thinking
        #: Whether a thinking block was seen (opened, or open from the prompt).
        self.saw_block = starts_thinking

    def push(self, text: str) -> tuple[str, str]:
        buf, self._held = self._held + text, ""
        reasoning, content = [], []
        while buf:
            if self.state == "before":
                stripped = buf.lstrip()
                if stripped.startswith(self.parser.open_tag):
                    buf = stripped[len(self.parser.open_tag) :]
                    self.state, self._strip_newline, self.saw_block = "thinking", True, True
                    continue
                if stripped and self.parser.open_tag.startswith(stripped):
                    self._held = buf  # could still become the opening tag
                    break
                if not stripped:
                    self._held = buf
                    break
                self.state = "after"  # no thinking block: all of it is the answer
                continue
            if self.state == "thinking":
                if self._strip_newline:
                    if buf.startswith("\n"):
                        buf = buf[1:]
                    self._strip_newline = False
                    continue
                at = buf.find(self.parser.close_tag)
                if at >= 0:
                    reasoning.append(buf[:at].removesuffix("\n"))
                    buf = buf[at + len(self.parser.close_tag) :]
                    self.state, self._strip_newline = "after", True
                    continue
                keep = _partial_suffix(buf, "\n" + self.parser.close_tag)
                reasoning.append(buf[: len(buf) - keep])
                self._held = buf[len(buf) - keep :]
                break
            if self._strip_newline:
                if buf.startswith("\n"):
                    buf = buf[1:]
                self._strip_newline = False
                continue
            content.append(buf)
            break
        return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        """What is still held back, at the end of the stream."""
        held, self._held = self._held, ""
        if self.state == "thinking":
            return held, ""
        return "", held.lstrip() if self.state == "before" else held


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that starts ``tag`` (it may complete later)."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def split_reasoning(text: str, parser: ReasoningParser, starts_thinking: bool = False) -> tuple[str | None, str]:
    """A whole answer -> (reasoning or None when there was no block, content)."""
    splitter = ReasoningSplitter(parser, starts_thinking)
    r1, c1 = splitter.push(text)
    r2, c2 = splitter.finish()
    return (r1 + r2 if splitter.saw_block else None), c1 + c2
