"""The one-pass GGUF header reader (``tokenops/engine/gguf/gguf_header.py``) against ggml-org's ``GGUFReader``:
every key, value, value type and tensor entry equal, on the packaged SmolLM2 file and on a generated
file holding every value type; what it does not read falls back to ``GGUFReader``; a broken file is a
GGUFError."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

from tests.real_model import gguf_path
from tokenops.engine.gguf.gguf_header import UnsupportedHeader, read_header
from tokenops.engine.gguf.gguf_reader import GGUFError, GGUFFile, _read_with_gguf


def _same(path) -> None:
    ours, reference = read_header(path), _read_with_gguf(path)
    assert ours[0].keys() == reference[0].keys()
    for key, value in ours[0].items():
        expected = reference[0][key]
        assert value == expected and type(value) is type(expected), key
        if isinstance(value, list):
            assert [type(v) for v in value] == [type(v) for v in expected], key
    assert ours[1] == reference[1]


def test_the_packaged_model_reads_as_gguf_reads_it() -> None:
    _same(gguf_path())


def _write(path, extra=None) -> None:
    w = GGUFWriter(str(path), "llama")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -5)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 0.1)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", 0.1)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo ✓")
    w.add_array("t.strs", ["a", "", "ünï", "<|im_end|>"])
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, -1.25])
    w.add_array("t.bools", [True, False, True])
    w.add_array("t.empty", [])
    if extra:
        extra(w)
    w.add_tensor("a.weight", np.arange(96, dtype=np.float32).reshape(3, 32))
    w.add_tensor("b.weight", np.zeros((2, 64), dtype=np.float16))
    q8 = np.zeros((4, 34), dtype=np.uint8)  # 4 rows of one Q8_0 block (32 values)
    w.add_tensor("c.weight", q8, raw_shape=q8.shape, raw_dtype=GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_every_value_type_and_tensor_entry_match(tmp_path) -> None:
    path = tmp_path / "all.gguf"
    _write(path)
    _same(path)
    f = GGUFFile(path)
    assert f.get("t.strs") == ["a", "", "ünï", "<|im_end|>"] and f.get("t.bool") is True
    assert np.array_equal(f.raw_view("a.weight").view(np.float32).reshape(-1), np.arange(96, dtype=np.float32))
    assert f.tensors["c.weight"].num_bytes == 4 * 34


def test_an_array_of_arrays_falls_back_to_gguf_reader(tmp_path) -> None:
    path = tmp_path / "nested.gguf"
    _write(path, lambda w: w.add_key_value("t.nested", [[1, 2], [3]], GGUFValueType.ARRAY))
    with pytest.raises(UnsupportedHeader):
        read_header(path)
    f = GGUFFile(path)  # through GGUFReader
    assert f.get("t.u8") == 200 and "a.weight" in f.tensors


def test_a_truncated_file_is_a_gguf_error(tmp_path) -> None:
    path = tmp_path / "cut.gguf"
    _write(path)
    data = path.read_bytes()
    for size in (4, 40, len(data) // 3):
        path.write_bytes(data[:size])
        with pytest.raises(GGUFError):
            GGUFFile(path)


def test_an_engine_build_reads_its_files_header_once(tmp_path, monkeypatch) -> None:
    from tests.engine.tiny_gguf import write_tiny_gguf
    from tokenops.engine.gguf import gguf_header
    from tokenops.engine.core.engine import EngineConfig
    from tokenops.engine.gguf.gguf_reader import reusing_headers
    from tokenops.engine.core.model_runner import ModelRunner

    reads: list[str] = []
    real = gguf_header.read_header

    def counted(path):
        reads.append(str(path))
        return real(path)

    monkeypatch.setattr(gguf_header, "read_header", counted)
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    GGUFFile(path).close()
    GGUFFile(path).close()
    assert len(reads) == 2  # outside a build nothing is kept
    reads.clear()
    runner = ModelRunner(EngineConfig(model=str(path), kv_cache_tokens=64, block_size=16))
    assert len(reads) == 1 and runner.tokenizer.encode("hi")  # the weights and the tokenizer from one read
    reads.clear()
    with reusing_headers():
        GGUFFile(path).close()
        _write(path)  # the file changed within the block: read again
        assert GGUFFile(path).get("t.u8") == 200
    assert len(reads) == 2
