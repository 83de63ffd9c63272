"""The tokenizer a GGUF file describes (``tokenizer.ggml.*``), as a ``tokenizers`` fast tokenizer.

Two vocabulary kinds, named by ``tokenizer.ggml.model``:

- ``gpt2``: byte-level BPE (Llama 3, Qwen, SmolLM...): the vocabulary and merges as stored,
  split first by the pre-tokenizer that ``tokenizer.ggml.pre`` names (:data:`BPE_PRE_TOKENIZERS`,
  the regexes llama.cpp uses for that name; one row per name, extend it for a new one).
- ``llama``: SentencePiece BPE (Llama 2, Mistral v0.1, TinyLlama): scores instead of merges,
  so merges are derived by score as SentencePiece's own algorithm ranks them; spaces become
  ``▁``, one is prefixed to every text run when ``tokenizer.ggml.add_space_prefix`` says so
  (after special tokens too, as llama.cpp does), unknown bytes fall back to ``<0xNN>`` tokens.

Control and user-defined tokens become added tokens, so a rendered chat template's
``<|im_start|>`` is one token. BOS is added by the metadata's ``add_bos_token`` (by the
vocabulary kind's default when absent); the end-of-generation ids are EOS, EOT, EOM and the
control tokens llama.cpp also treats as end of generation.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenops.engine.core.tokenizer import Tokenizer
from tokenops.engine.gguf.gguf_reader import GGUFError, GGUFFile

# llama.cpp's token types (llama_token_type)
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6

_GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True, slots=True)
class BPEPreTokenizer:
    """How a ``gpt2`` vocabulary splits text before merging: regexes applied in turn (each
    match becomes its own piece), whether single digits are split off first, and llama.cpp's
    ``ignore_merges`` (a whole word found in the vocabulary is one token) and BOS default."""

    regexes: tuple[str, ...]
    split_digits: bool = False
    ignore_merges: bool = False
    add_bos: bool = False


#: ``tokenizer.ggml.pre`` -> its pre-tokenizer (llama.cpp's ``llama-vocab.cpp`` names).
BPE_PRE_TOKENIZERS: dict[str, BPEPreTokenizer] = {
    "default": BPEPreTokenizer((_GPT2_REGEX,)),
    "gpt-2": BPEPreTokenizer((_GPT2_REGEX,)),
    "smollm": BPEPreTokenizer((_GPT2_REGEX,), split_digits=True),
    "llama-bpe": BPEPreTokenizer((_LLAMA3_REGEX,), ignore_merges=True, add_bos=True),
    "llama3": BPEPreTokenizer((_LLAMA3_REGEX,), ignore_merges=True, add_bos=True),
    "llama-v3": BPEPreTokenizer((_LLAMA3_REGEX,), ignore_merges=True, add_bos=True),
    "qwen2": BPEPreTokenizer((_QWEN2_REGEX,)),
    "qwen35": BPEPreTokenizer((_QWEN2_REGEX,)),
    "deepseek-r1-qwen": BPEPreTokenizer((_QWEN2_REGEX,)),
}
#: Control tokens llama.cpp ends generation on besides EOS/EOT/EOM (its ``special_eog_ids`` by text).
_EOG_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<EOT>",
    "<|end_of_text|>",
    "<|return|>",
    "<|call|>",
    "<|eom_id|>",
)

#: Gemma's turn format (its model card's), for Gemma GGUF files written without
#: ``tokenizer.chat_template`` (the registry's Gemma 3 270M Q4_K_M is one): a system message opens
#: the first user turn, the assistant's role is ``model``. BOS comes from the tokenizer.
GEMMA_TURNS = (
    "{% set ns = namespace(system='') %}"
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{% set ns.system = ns.system + message['content'] + '\n\n' %}"
    "{% else %}<start_of_turn>{{ 'model' if message['role'] == 'assistant' else 'user' }}\n"
    "{% if loop.first or (loop.index0 == 1 and messages[0]['role'] == 'system') %}{{ ns.system }}{% endif %}"
    "{{ message['content'] }}<end_of_turn>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
#: The chat format of an architecture whose GGUF files may lack a template (else the generic fallback).
ARCHITECTURE_CHAT_TEMPLATES = {"gemma": GEMMA_TURNS, "gemma2": GEMMA_TURNS, "gemma3": GEMMA_TURNS}


def gguf_tokenizer(file: GGUFFile) -> Tokenizer:
    """The engine :class:`Tokenizer` of a GGUF file (vocabulary, specials, chat template, stops)."""
    kind = file.get("tokenizer.ggml.model")
    tokens = file.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise GGUFError("GGUF file has no tokenizer (tokenizer.ggml.tokens)")
    types = file.get("tokenizer.ggml.token_type") or [_NORMAL] * len(tokens)
    if kind == "gpt2":
        backend, default_bos = _byte_level_bpe(file, tokens, types)
    elif kind == "llama":
        backend, default_bos = _sentencepiece_bpe(file, tokens, types), True
    else:
        raise GGUFError(f"GGUF tokenizer model {kind!r} is not supported (gpt2 BPE and llama SentencePiece are)")
    _add_special_tokens(backend, tokens, types)

    def token(key: str) -> str | None:
        idx = file.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[idx] if isinstance(idx, int) and 0 <= idx < len(tokens) else None

    special = {
        "bos_token": token("bos"),
        "eos_token": token("eos"),
        "pad_token": token("padding"),
        "unk_token": token("unknown"),
    }
    eos_ids = {file.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")}
    eos_ids |= {i for i, t in enumerate(tokens) if types[i] == _CONTROL and t in _EOG_TEXTS}
    add_bos = file.get("tokenizer.ggml.add_bos_token")
    template = file.get("tokenizer.chat_template")
    if template is None:
        template = ARCHITECTURE_CHAT_TEMPLATES.get(str(file.get("general.architecture", "")))
    return Tokenizer(
        backend,
        special,
        template,
        {i for i in eos_ids if isinstance(i, int)},
        bool(default_bos if add_bos is None else add_bos),
    )


def _byte_level_bpe(file: GGUFFile, tokens: list[str], types: list[int]):
    from tokenizers import Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as Backend

    pre_name = str(file.get("tokenizer.ggml.pre", "default"))
    pre = BPE_PRE_TOKENIZERS.get(pre_name)
    if pre is None:
        raise GGUFError(f"GGUF pre-tokenizer {pre_name!r} is not supported; supported: {', '.join(BPE_PRE_TOKENIZERS)}")
    merges = [tuple(m.split(" ", 1)) for m in file.get("tokenizer.ggml.merges") or []]
    vocab = {t: i for i, t in enumerate(tokens)}
    backend = Backend(models.BPE(vocab=vocab, merges=merges, ignore_merges=pre.ignore_merges, fuse_unk=False))
    steps: list[pre_tokenizers.PreTokenizer] = []
    if pre.split_digits:
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    if pre.regexes == (_GPT2_REGEX,):
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    else:
        steps += [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in pre.regexes]
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    backend.pre_tokenizer = steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)
    backend.decoder = decoders.ByteLevel()
    return backend, pre.add_bos


def _sentencepiece_bpe(file: GGUFFile, tokens: list[str], types: list[int]):
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, normalizers

    scores = file.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    mergeable = {t: i for i, t in enumerate(tokens) if types[i] in (_NORMAL, _USER_DEFINED, _UNUSED)}
    candidates = []
    for piece, idx in mergeable.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in mergeable and right in mergeable:
                # SentencePiece merges the pair whose result scores highest first; ties by vocabulary order
                candidates.append((-scores[idx], vocab[left], vocab[right], left, right))
    candidates.sort()
    merges = [(left, right) for _, _, _, left, right in candidates]
    unk_id = file.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if isinstance(unk_id, int) and 0 <= unk_id < len(tokens) else None
    backend = Backend(models.BPE(vocab=vocab, merges=merges, unk_token=unk, byte_fallback=True, fuse_unk=True))
    add_prefix = file.get("tokenizer.ggml.add_space_prefix")
    add_prefix = True if add_prefix is None else bool(add_prefix)
    steps: list[normalizers.Normalizer] = [normalizers.Replace(" ", "\u2581")]
    if add_prefix:
        steps.insert(0, normalizers.Prepend("\u2581"))
    backend.normalizer = normalizers.Sequence(steps)
    decode = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_prefix:
        decode.append(decoders.Strip(" ", 1, 0))
    backend.decoder = decoders.Sequence(decode)
    return backend


def _add_special_tokens(backend, tokens: list[str], types: list[int]) -> None:
    """Control tokens (special: skipped when decoding for display) and user-defined ones as
    added tokens, so they are matched whole in text."""
    from tokenizers import AddedToken

    added = []
    for i, t in enumerate(tokens):
        if types[i] == _CONTROL or types[i] == _UNKNOWN:
            added.append(AddedToken(t, special=True, normalized=False))
        elif types[i] == _USER_DEFINED:
            added.append(AddedToken(t, special=False, normalized=False))
    # add_tokens keeps the ids of tokens already in the vocabulary
    backend.add_special_tokens([a for a in added if a.special])
    backend.add_tokens([a for a in added if not a.special])
