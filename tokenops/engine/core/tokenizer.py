"""Tokenization for the bundled engine: the ``tokenizers`` library plus the model's
jinja2 chat template, and incremental detokenization for streaming.

Files read from a model folder: ``tokenizer.json`` (required),
``tokenizer_config.json`` (special tokens, ``chat_template``), ``chat_template.jinja``
or ``chat_template.json`` (where newer ``transformers`` put the template),
``config.json`` and ``generation_config.json`` (extra EOS ids).

When a model ships no chat template, :data:`FALLBACK_CHAT_TEMPLATE` is used: one
``role: content`` paragraph per message and ``assistant:`` as the generation prompt.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tokenizers

if TYPE_CHECKING:
    import jinja2

FALLBACK_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


#: Texts longer than this are encoded through ``encode_batch``, which releases the GIL.
_GIL_FREE_CHARS = 2000


class ChatTemplateError(ValueError):
    """The chat template rejected the conversation (``raise_exception``) or failed to render."""


class Tokenizer:
    """Encode/decode text and render chat conversations for one model."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        special_tokens: dict[str, str | None] | None = None,
        chat_template: str | None = None,
        extra_eos_token_ids: set[int] | None = None,
        add_bos_token: bool | None = None,
    ) -> None:
        self.backend = backend
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v}
        self.chat_template = chat_template
        self.has_chat_template = chat_template is not None
        self.bos_token = self.special_tokens.get("bos_token")
        self.eos_token = self.special_tokens.get("eos_token")
        self.bos_token_id = backend.token_to_id(self.bos_token) if self.bos_token else None
        eos = set(extra_eos_token_ids or ())
        eos_id = backend.token_to_id(self.eos_token) if self.eos_token else None
        if eos_id is not None:
            eos.add(eos_id)
        self.eos_token_ids: set[int] = eos
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self.add_bos_token = add_bos_token
        self._template: jinja2.Template | None = None
        self._renders_tools: bool | None = None

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Load the tokenizer files of a Hugging Face model folder."""
        path = Path(path)
        file = path / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(f"{path} has no tokenizer.json (only fast tokenizers are supported)")
        backend = tokenizers.Tokenizer.from_file(str(file))
        cfg = _read_json(path / "tokenizer_config.json")
        special = {k: _token_str(cfg.get(k)) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
        template = _find_template(path, cfg)
        eos_ids: set[int] = set()
        for extra in ("config.json", "generation_config.json"):
            eos_ids |= _as_id_set(_read_json(path / extra).get("eos_token_id"))
        if special["bos_token"] is None:
            bos_id = _read_json(path / "config.json").get("bos_token_id")
            if isinstance(bos_id, int):
                special["bos_token"] = backend.id_to_token(bos_id)
        return cls(backend, special, template, eos_ids, cfg.get("add_bos_token"))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``. With special tokens, BOS is added once: a text that
        already starts with the BOS string (a rendered chat template) gets no second BOS."""
        if len(text) > _GIL_FREE_CHARS:
            # encode_batch runs without the GIL (encode holds it throughout: ~0.8 s for 60k
            # tokens, during which a server's event loop in another thread cannot run)
            ids = self.backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        else:
            ids = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        bos = self.bos_token_id
        if not add_special_tokens or bos is None:
            return ids
        if self.add_bos_token and (not ids or ids[0] != bos):
            ids = [bos, *ids]
        if len(ids) >= 2 and ids[0] == bos and ids[1] == bos and text.startswith(self.bos_token or "\0"):
            ids = ids[1:]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str:
        """The vocabulary entry (e.g. ``Ġhello`` for byte-level BPE); ``""`` if out of range."""
        return self.backend.id_to_token(token_id) or ""

    def token_text(self, token_id: int) -> str:
        """The text one token decodes to on its own (special tokens included)."""
        return self.backend.decode([token_id], skip_special_tokens=False)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """Render ``messages`` with the model's chat template (or the fallback).

        Extra keyword arguments (``tools``, ``enable_thinking``...) reach the template. As in
        transformers' ``apply_chat_template``, ``tools`` and ``documents`` are defined (``None``)
        when not given: a template testing ``tools is not none`` (Mistral's) adds no tools block.
        :raises ChatTemplateError: when the template calls ``raise_exception`` or fails.
        """
        import jinja2

        if self._template is None:
            self._template = _compile(self.chat_template or FALLBACK_CHAT_TEMPLATE)
        variables = {"tools": None, "documents": None, **self.special_tokens, **kwargs}
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt, **variables)
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template failed: {e}") from None

    def renders_tools(self) -> bool:
        """Whether the chat template writes ``tools`` into the prompt: a conversation rendered with
        and without a dummy tool differs. Decided once per tokenizer (templates are fixed at load);
        a template that fails either way counts as not rendering them."""
        if self._renders_tools is None:
            probe = [{"role": "user", "content": "hi"}]
            tool = {"type": "function", "function": _PROBE_TOOL}
            try:
                self._renders_tools = self.apply_chat_template(probe, tools=[tool]) != self.apply_chat_template(probe)
            except ChatTemplateError:
                self._renders_tools = False
        return self._renders_tools


#: The dummy tool :meth:`Tokenizer.renders_tools` renders (a name no template special-cases).
_PROBE_TOOL = {
    "name": "tokenops_probe_tool",
    "description": "A tool that probes the chat template.",
    "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
}


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas.

    Each :meth:`push` decodes a short window of recent tokens (the window keeps one
    already-emitted stretch in front so decoders that treat the first token
    specially, like SentencePiece's leading space, decode it in context). While
    the window ends in U+FFFD, a multi-byte character is still arriving (or the
    decoder re-grouped fallback bytes) and nothing is emitted, so a character split
    across tokens arrives whole. Bytes that are invalid for good are emitted as
    U+FFFD together with the next complete character, or by :meth:`flush`.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.token_ids: list[int] = []
        self.text = ""
        # Text of token_ids[prefix_offset:read_offset] was emitted already.
        self._prefix_offset = 0
        self._read_offset = 0

    def push(self, token_id: int) -> str:
        """Add one token; returns the newly completed text (may be ``""``)."""
        self.token_ids.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        """Emit whatever is held back, unfinished characters as U+FFFD (end of stream)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        ids = self.token_ids
        if self._read_offset == len(ids):
            return ""
        decode = self.tokenizer.decode
        prefix = decode(ids[self._prefix_offset : self._read_offset], self.skip_special_tokens)
        new = decode(ids[self._prefix_offset :], self.skip_special_tokens)[len(prefix) :]
        if not final and (not new or new.endswith("\ufffd")):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(ids)
        self.text += new
        return new


def _compile(source: str) -> jinja2.Template:
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ChatTemplateError(message)

    def tojson(
        value: Any, indent: int | None = None, separators=None, sort_keys: bool = False, ensure_ascii: bool = False
    ) -> str:
        return json.dumps(value, indent=indent, separators=separators, sort_keys=sort_keys, ensure_ascii=ensure_ascii)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template does not parse: {e}") from None


def _find_template(path: Path, cfg: dict[str, Any]) -> str | None:
    template = cfg.get("chat_template")
    if template is None and (path / "chat_template.jinja").is_file():
        template = (path / "chat_template.jinja").read_text(encoding="utf-8")
    if template is None:
        template = _read_json(path / "chat_template.json").get("chat_template")
    if isinstance(template, list):  # named templates: take "default"
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def _token_str(value: Any) -> str | None:
    if isinstance(value, dict):  # serialised AddedToken
        return value.get("content")
    return value if isinstance(value, str) else None


def _as_id_set(value: Any) -> set[int]:
    if isinstance(value, int):
        return {value}
    if isinstance(value, list):
        return {v for v in value if isinstance(v, int)}
    return set()
