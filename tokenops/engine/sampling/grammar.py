"""Grammar-constrained decoding: the mechanism (the policy of *what* to constrain
lives with the callers: ``response_format``, forced ``tool_choice``).

A :class:`GrammarSpec` (a JSON schema or a Lark grammar) is compiled by
:class:`GrammarCompiler` with llguidance into a matcher against the model's
tokenizer. Compiling happens on a small thread pool (``compile_async``), so the
request that asked for a grammar waits, never the batch; compiled grammars are
cached by spec and each request gets a cheap copy. Per step, the sampler asks
each constrained row's :class:`GrammarMatcher` for a token bitmask and masks only
those rows (:func:`apply_token_bitmasks`); the output processor advances the
matcher with every accepted token and ends the sequence when the grammar is
complete.

llguidance was picked over xgrammar by measured CPU cost on the demo tokenizer
(docs/serve.md, "Structured outputs and tool calling"): compiling a 5-field schema
took ~0.6 ms against ~35-67 ms, a mask ~0.1-0.2 ms per row per step against
~0.03 ms, and it needs no extra dependencies (xgrammar pulls in triton).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: Compiled grammars kept per engine (least recently used dropped first) ...
GRAMMAR_CACHE_SIZE = 128
#: ... and the bytes they may hold in all: each entry is charged its source, its sample
#: text and :data:`ENTRY_OVERHEAD_BYTES` (llguidance's compiled lexer and parser tables,
#: which grow with the source: charged 16 bytes per source byte on top).
GRAMMAR_CACHE_BYTES = 64 * 1024 * 1024
ENTRY_OVERHEAD_BYTES = 64 * 1024
#: llguidance's resource limits for every grammar compiled here: its defaults, but a
#: smaller lexer (states take 1-2 kB each) and errors without the parser's state (they
#: reach clients as 400 messages; the state is internals).
MAX_LEXER_STATES = 50_000
#: The longest a request waits for its grammar (the compiler's fuel limits make this rare).
COMPILE_TIMEOUT_S = 10.0
MAX_GRAMMAR_SIZE = 200_000
#: Budget-aware close: tokens kept beyond the grammar's shortest text (a string to close,
#: multi-token keys), and the reserve of a grammar with no shortest text.
CLOSING_MARGIN_TOKENS = 8
DEFAULT_RESERVE_TOKENS = 24


class GrammarError(ValueError):
    """The grammar or schema cannot be compiled (the message says why)."""


@dataclass(slots=True, frozen=True)
class GrammarSpec:
    """What to constrain a sequence to. ``kind`` is ``json_schema`` (``source`` is the
    schema as compact JSON text, property order kept) or ``lark`` (a llguidance Lark grammar, which may
    embed JSON schemas with ``%json{...}``). ``shortest`` is a short text the grammar
    accepts (the budget-aware close starts when the tokens left come near its length)."""

    kind: str
    source: str
    shortest: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("json_schema", "lark"):
            raise ValueError(f"unknown grammar kind {self.kind!r} (json_schema or lark)")

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | bool) -> GrammarSpec:
        from tokenops.engine.sampling.json_schema_size import SchemaSizeError
        from tokenops.engine.sampling.json_shortest import shortest_json

        try:
            shortest = shortest_json(schema)
        except SchemaSizeError as e:
            where = f" (at {e.where})" if e.where else ""
            raise GrammarError(f"the schema {e}{where}") from None
        # key order is property order
        return cls("json_schema", json.dumps(schema, separators=(",", ":")), shortest)

    @property
    def num_bytes(self) -> int:
        """What a cache entry of this spec is charged (see :data:`GRAMMAR_CACHE_BYTES`)."""
        return 17 * len(self.source) + len(self.shortest) + ENTRY_OVERHEAD_BYTES


class GrammarMatcher:
    """One sequence's position in a grammar. ``accept`` advances it by a token;
    ``fill_bitmask`` writes the tokens allowed next into a row of an int32 bitmask."""

    __slots__ = ("_m", "closing_classes", "reserve_tokens")

    def __init__(self, matcher: Any, closing_classes: Any = None, reserve_tokens: int = DEFAULT_RESERVE_TOKENS) -> None:
        self._m = matcher
        #: Bool ``[vocab]`` token classes, best first, that :func:`steer_to_close` prefers.
        self.closing_classes = closing_classes
        #: Steer to close once no more than this many tokens are left (the grammar's
        #: shortest text in tokens plus a margin).
        self.reserve_tokens = reserve_tokens

    def copy(self) -> GrammarMatcher:
        """An independent matcher in the same state (for ``n > 1`` siblings)."""
        return GrammarMatcher(self._m.deep_copy(), self.closing_classes, self.reserve_tokens)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        v = bitmask[row]
        self._m.unsafe_compute_mask_ptr(v.data_ptr(), v.numel() * v.element_size())

    def accept(self, token_id: int) -> bool:
        """Advance by ``token_id``; False when the grammar does not allow it."""
        return bool(self._m.consume_token(token_id))

    @property
    def is_finished(self) -> bool:
        """The grammar is complete: only end-of-sequence may follow."""
        return bool(self._m.is_stopped())

    @property
    def error(self) -> str | None:
        return self._m.get_error() if self._m.is_error() else None


def _plain_added_tokens(tokenizer_json: str) -> str:
    """``tokenizer_json`` with its added tokens that are not special (Qwen2.5's ``<tool_call>`` and
    ``</tool_call>``) moved into the model's vocabulary. llguidance treats every added token as a
    special one, except when it forces literal text: the text ``<tool_call>`` a grammar writes was
    masked to that token alone, which consuming it then refused (a forced Hermes call on
    Qwen2.5-Coder failed at its first token). As plain tokens their text is theirs throughout."""
    data = json.loads(tokenizer_json)
    vocab = (data.get("model") or {}).get("vocab")
    added = data.get("added_tokens") or []
    if not isinstance(vocab, dict) or all(t.get("special") for t in added):
        return tokenizer_json
    for token in added:
        if not token.get("special"):
            vocab.setdefault(token["content"], token["id"])
    data["added_tokens"] = [t for t in added if t.get("special")]
    return json.dumps(data, ensure_ascii=False)


class GrammarCompiler:
    """Compiles :class:`GrammarSpec` for one tokenizer, off the engine thread, with a cache.

    ``vocab_size`` is the model's logits width (may exceed the tokenizer's vocabulary);
    ``eos_token_ids`` the ids that end a sequence (allowed once the grammar is complete).
    """

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_ids: list[int], max_workers: int = 1) -> None:
        self.vocab_size = vocab_size
        self._tokenizer_json = tokenizer_json
        self._eos = sorted(eos_token_ids)
        self._lltok: Any = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[GrammarSpec, tuple[Any, int]] = OrderedDict()  # -> (matcher, reserve)
        self.num_cache_bytes = 0
        self.max_cache_bytes = GRAMMAR_CACHE_BYTES
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="tokenops-grammar")
        self.num_compiled = 0
        self.num_cache_hits = 0
        self._closing: Any = None

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, vocab_size: int) -> GrammarCompiler:
        """From a :class:`tokenops.engine.core.tokenizer.Tokenizer` (its ``tokenizers`` backend)."""
        eos = sorted(getattr(tokenizer, "eos_token_ids", ()) or ())
        return cls(_plain_added_tokens(tokenizer.backend.to_str()), vocab_size, eos)

    def _tokenizer(self) -> Any:
        if self._lltok is None:  # ~50 ms: built on first use, not at engine start
            import llguidance

            self._lltok = llguidance.LLTokenizer(
                self._tokenizer_json, n_vocab=self.vocab_size, eos_token=self._eos or None
            )
        return self._lltok

    def _closing_classes(self) -> Any:
        """Token classes :func:`steer_to_close` prefers, in order: end of sequence (where the
        grammar allows it: a turn of complete calls ends rather than start one more), tokens
        that start with a quote and hold only JSON closers (``"]}``; they end a string), tokens
        of only ``]`` and ``}``, tokens of only closers and separators (``"]},:``). Decoded once
        per tokenizer."""
        if self._closing is None:
            import torch

            lltok = self._tokenizer()
            eos = torch.zeros(self.vocab_size, dtype=torch.bool)
            eos[[t for t in self._eos if t < self.vocab_size]] = True
            classes = tuple(torch.zeros(self.vocab_size, dtype=torch.bool) for _ in range(3))
            for token_id in range(min(self.vocab_size, lltok.vocab_size)):
                if lltok.is_special_token(token_id):
                    continue
                text = lltok.decode_bytes([token_id])
                if not text or text.strip(b'"]},:'):
                    continue
                classes[0][token_id] = text.startswith(b'"') and not text.strip(b'"]}')
                classes[1][token_id] = not text.strip(b"]}")
                classes[2][token_id] = True
            self._closing = (eos, *classes)
        return self._closing

    def compile(self, spec: GrammarSpec) -> GrammarMatcher:
        """A fresh matcher for ``spec`` (compiled once, then copied from the cache).

        :raises GrammarError: when the schema or grammar does not compile.
        """
        import llguidance

        with self._lock:
            cached = self._cache.get(spec)
            if cached is not None:
                self._cache.move_to_end(spec)
                self.num_cache_hits += 1
                return GrammarMatcher(cached[0].deep_copy(), self._closing, cached[1])
            lltok = self._tokenizer()
            closing = self._closing_classes()
        try:
            if spec.kind == "json_schema":
                grammar = llguidance.LLMatcher.grammar_from_json_schema(
                    spec.source, defaults={"whitespace_flexible": False}
                )
            else:
                grammar = llguidance.LLMatcher.grammar_from_lark(spec.source)
        except ValueError as e:
            raise GrammarError(f"cannot compile the schema: {_first_line(str(e))}") from None
        limits = parser_limits()
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, lltok, limits=limits)
        if is_error:
            raise GrammarError(f"cannot compile the schema: {_first_line(messages[0])}")
        pristine = llguidance.LLMatcher(lltok, grammar, log_level=0, limits=limits)
        if pristine.is_error():
            raise GrammarError(f"cannot compile the schema: {_first_line(pristine.get_error())}")
        reserve = (
            len(lltok.tokenize_str(spec.shortest)) + CLOSING_MARGIN_TOKENS if spec.shortest else DEFAULT_RESERVE_TOKENS
        )
        with self._lock:
            self.num_compiled += 1
            if spec.num_bytes <= self.max_cache_bytes // 4 and spec not in self._cache:  # a huge one is not kept
                self._cache[spec] = (pristine, reserve)
                self.num_cache_bytes += spec.num_bytes
            while self._cache and (
                len(self._cache) > GRAMMAR_CACHE_SIZE or self.num_cache_bytes > self.max_cache_bytes
            ):
                old, _ = self._cache.popitem(last=False)
                self.num_cache_bytes -= old.num_bytes
        return GrammarMatcher(pristine.deep_copy(), closing, reserve)

    def warm(self) -> None:
        """Build what every compile needs once per tokenizer now: llguidance's tokenizer (11.6 s for
        Qwen2.5's 151,936 tokens on a busy 2-core box) and the closing classes, so that a request's
        compile, which the backend bounds by :data:`COMPILE_TIMEOUT_S`, does not pay for them."""
        with self._lock:
            self._tokenizer()
            self._closing_classes()

    async def warm_async(self) -> None:
        """:meth:`warm` on the compiler's thread pool (returns at once when warm)."""
        if self._closing is None:
            await asyncio.get_running_loop().run_in_executor(self._pool, self.warm)

    async def compile_async(self, spec: GrammarSpec) -> GrammarMatcher:
        """:meth:`compile` on the compiler's thread pool: the caller waits, the event loop
        and the engine thread do not."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, self.compile, spec)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def parser_limits() -> Any:
    """The :class:`llguidance.LLParserLimits` of every matcher (see :data:`MAX_LEXER_STATES`)."""
    import llguidance

    return llguidance.LLParserLimits(
        max_lexer_states=MAX_LEXER_STATES, max_grammar_size=MAX_GRAMMAR_SIZE, verbose_errors=False
    )


def _first_line(message: str) -> str:
    # one line, bounded: llguidance messages may quote the grammar
    line = message.strip().splitlines()[0] if message.strip() else "invalid grammar"
    return line if len(line) <= 300 else line[:297] + "..."


def new_bitmask(num_rows: int, vocab_size: int) -> torch.Tensor:
    """An int32 bitmask ``[num_rows, ceil(vocab / 32)]`` with every token allowed."""
    import torch

    return torch.full((num_rows, (vocab_size + 31) // 32), -1, dtype=torch.int32)


def apply_token_bitmasks(logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor) -> torch.Tensor:
    """``logits`` with ``-inf`` for the tokens row ``rows[j]`` may not take (bit clear in
    ``bitmask[j]``); other rows unchanged. Out of place (the runner's logits may be
    inference tensors); only the constrained rows are masked."""
    import numpy as np
    import torch

    vocab = logits.shape[1]
    # little-endian int32 words unpack, byte by byte and low bit first, into token order
    bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1, count=vocab, bitorder="little")
    allowed = torch.from_numpy(bits.view(np.bool_)).to(logits.device)
    if allowed.shape[1] < vocab:  # logits wider than the bitmask: the extra tokens are not allowed
        pad = torch.zeros(len(rows), vocab - allowed.shape[1], dtype=torch.bool, device=logits.device)
        allowed = torch.cat([allowed, pad], dim=1)
    if len(rows) == logits.shape[0] and rows == list(range(len(rows))):  # every row constrained: no gather
        return torch.where(allowed, logits, float("-inf"))
    index = torch.tensor(rows, device=logits.device)
    masked = torch.where(allowed, logits.index_select(0, index), float("-inf"))
    return logits.index_copy(0, index, masked)


def steer_to_close(logits: torch.Tensor, rows: list[int], matchers: list[GrammarMatcher]) -> torch.Tensor:
    """Budget-aware completion for rows near their token limit (already masked by their
    grammar): keep only the allowed tokens of the first of the matcher's closing classes
    that has any (one that ends a string, one that closes an array or object, one that
    closes or separates); a row that can take none (a forced key, a digit) is left as it
    is. Without it a model that never writes the closing quote of a string (the demo
    models) runs out of tokens inside it and the answer is not JSON; with it the grammar
    is completed in the tokens left (the grammar forces the keys still required, this
    picks the shortest way through the values)."""
    import torch

    classes = next((m.closing_classes for m in matchers if m.closing_classes is not None), None)
    if classes is None:
        return logits
    index = torch.tensor(rows, device=logits.device)
    sub = logits.index_select(0, index)
    allowed = torch.isfinite(sub)
    keep = allowed
    # a row in free text (a reply beside tool calls: it may end here and most tokens may follow;
    # inside a JSON string most may follow too, but not the end) is not steered
    may_end = (allowed & classes[0].to(logits.device)).any(dim=1)
    is_steered = may_end & (allowed.sum(dim=1) > allowed.shape[1] // 2)
    for tokens in classes:  # per row, the first class that has an allowed token wins
        in_class = allowed & tokens.to(logits.device)
        takes = in_class.any(dim=1) & ~is_steered
        keep = torch.where(takes.unsqueeze(1), in_class, keep)
        is_steered |= takes
    return logits.index_copy(0, index, torch.where(keep, sub, float("-inf")))
