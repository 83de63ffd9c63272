"""Tokenizer: encode/decode against transformers, chat templates, incremental detokenization."""

from __future__ import annotations

import json

import pytest

from tiny_models import CHAT_TEMPLATE
from tokenops.engine.core.tokenizer import (
    FALLBACK_CHAT_TEMPLATE,
    ChatTemplateError,
    IncrementalDetokenizer,
    Tokenizer,
)

TEXTS = ["hello world", "emoji 😀😃 and 🎉!", "中文字符 日本語 한국어", "mixed: héllo ñ 😀中"]
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi 😀"}]


@pytest.fixture(scope="module")
def tok(tiny_llama_dir):
    return Tokenizer.from_dir(tiny_llama_dir)


def test_encode_decode_match_transformers(tok, tiny_llama_dir):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(tiny_llama_dir))
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == hf.encode(text)
        assert tok.decode(ids) == text == hf.decode(ids)
    assert tok.vocab_size == len(hf)
    assert tok.eos_token_ids == {hf.eos_token_id}
    assert tok.id_to_token(ids[0]) == hf.convert_ids_to_tokens(ids[0])
    assert tok.id_to_token(10**6) == ""


def test_chat_template_matches_transformers(tok, tiny_llama_dir):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(tiny_llama_dir))
    for gen in (True, False):
        expected = hf.apply_chat_template(MESSAGES, add_generation_prompt=gen, tokenize=False)
        assert tok.apply_chat_template(MESSAGES, add_generation_prompt=gen) == expected
    assert tok.has_chat_template


def test_chat_template_raise_exception_is_a_clear_error(tok):
    with pytest.raises(ChatTemplateError, match="unknown role tool"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}])


def test_special_tokens_skipped_on_decode(tok):
    ids = tok.encode(tok.apply_chat_template(MESSAGES))
    assert "<|im_start|>" in tok.decode(ids, skip_special_tokens=False)
    assert "<|im_start|>" not in tok.decode(ids)
    assert tok.token_text(ids[0]) == "<|im_start|>"


def _write_tokenizer_dir(path, tokenizer_config, chat_template_file=None):
    from tiny_models import tiny_tokenizer

    path.mkdir()
    tiny_tokenizer().save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    if chat_template_file is not None:
        (path / "chat_template.jinja").write_text(chat_template_file)
    return path


def test_template_sources_and_fallback(tmp_path):
    inline = Tokenizer.from_dir(_write_tokenizer_dir(tmp_path / "a", {"chat_template": CHAT_TEMPLATE}))
    named = Tokenizer.from_dir(
        _write_tokenizer_dir(tmp_path / "b", {"chat_template": [{"name": "default", "template": CHAT_TEMPLATE}]})
    )
    assert inline.apply_chat_template(MESSAGES) == named.apply_chat_template(MESSAGES)
    none = Tokenizer.from_dir(_write_tokenizer_dir(tmp_path / "c", {}))
    assert not none.has_chat_template
    assert none.apply_chat_template(MESSAGES) == "system: be brief\n\nuser: hi 😀\n\nassistant:"
    assert FALLBACK_CHAT_TEMPLATE


def test_bos_and_eos_from_configs(tmp_path):
    from tiny_models import tiny_tokenizer

    bos = "<|endoftext|>"
    path = _write_tokenizer_dir(
        tmp_path / "d",
        {"bos_token": {"content": bos}, "eos_token": "<|im_end|>", "add_bos_token": True,
         "chat_template": "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"},
    )  # fmt: skip
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 2]}))
    tok = Tokenizer.from_dir(path)
    bos_id = tiny_tokenizer().token_to_id(bos)
    assert tok.bos_token_id == bos_id
    assert tok.eos_token_ids == {1, 2, tiny_tokenizer().token_to_id("<|im_end|>")}
    assert tok.encode("hi")[0] == bos_id
    assert tok.encode("hi", add_special_tokens=False)[0] != bos_id
    rendered = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    ids = tok.encode(rendered)
    assert ids[0] == bos_id and ids[1] != bos_id  # never a double BOS


def test_missing_tokenizer_json(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        Tokenizer.from_dir(tmp_path)


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_detokenizer_never_splits_characters(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    # Byte-level BPE splits some multi-byte characters across tokens.
    assert any("\ufffd" in tok.decode([i]) for i in ids) or text.isascii()
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.push(i) for i in ids]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == detok.text == text
    assert detok.flush() == ""


def test_incremental_detokenizer_skips_specials_and_flushes_invalid_bytes(tok):
    end = tok.encode("<|im_end|>", add_special_tokens=False)
    lead = tok.encode("😀", add_special_tokens=False)[0]  # a lone leading byte
    detok = IncrementalDetokenizer(tok)
    assert detok.push(end[0]) == ""
    assert detok.push(tok.encode("a", add_special_tokens=False)[0]) == "a"
    assert detok.push(lead) == ""
    assert detok.flush() == "\ufffd"
    assert detok.text == "a\ufffd"
    # Bytes that can never complete come out with the next complete character.
    garbage = IncrementalDetokenizer(tok)
    assert "".join(garbage.push(lead) for _ in range(6)) == ""
    assert garbage.push(tok.encode("b", add_special_tokens=False)[0]) == "\ufffd" * 6 + "b"


def test_incremental_detokenizer_with_sentencepiece_byte_fallback():
    """Llama-2/Mistral-style tokenizers decode unfinished bytes as one U+FFFD per byte."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, normalizers

    vocab = {f"<0x{b:02X}>": b for b in range(256)}
    for ch in "▁abcdefghijklmnopqrstuvwxyz":
        vocab.setdefault(ch, len(vocab))
    backend = Backend(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token=None))
    backend.normalizer = normalizers.Replace(" ", "▁")
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok = Tokenizer(backend)
    text = "hi 😀 ok 中文 x"
    ids = tok.encode(text)
    assert tok.decode(ids[:4]).count("\ufffd") >= 1  # a partial emoji shows up as replacement chars
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.push(i) for i in ids]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == text == tok.decode(ids)
