"""The C as C (issue 53 part 3): ``tokenops/engine/csrc`` builds warning-free in every variant, the
headers are the one declaration Python's ctypes reads, a mismatch between a header and the code is
caught, the build cache follows every source and header, and (slow tier) the kernel tests pass on an
AddressSanitizer + UndefinedBehaviorSanitizer build."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tokenops.engine.kernels import c_header, fused_library, native
from tokenops.engine.kernels.c_header import CSRC, HeaderError, bind, parse, read, struct_mismatch
from tokenops.engine.lora import lora_native

ROOT = Path(__file__).resolve().parents[2]
CC = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler")

#: every library the engine builds: (main source, its defines)
VARIANTS = [
    ("paged_decode.c", []),
    ("quant.c", []),
    ("quant.c", ["TK_PLAIN=1"]),
    ("fused_decode.c", []),
    ("fused_decode.c", ["TK_PANEL_BF16=1"]),
    ("fused_decode.c", ["TK_KV_BF16=1"]),
    ("fused_decode.c", ["TK_QUANT=1"]),
    ("fused_decode.c", ["TK_QUANT=1", "TK_KV_BF16=1"]),
]
#: -march targets beside native that reach other #if paths: no SIMD, AVX2 without VNNI, AVX-512 + AMX
OTHER_MARCH = ["x86-64", "haswell", "sapphirerapids"]
WERROR = ["-std=c11", "-fopenmp", "-fPIC", "-Wall", "-Wextra", "-Werror"]
#: the fast check parses only (the front end's warnings); the slow one compiles at -O2 (the optimiser's too)
SYNTAX, FULL = ["-fsyntax-only"], ["-O2", "-c", "-o", os.devnull]


def _compile(
    main: str, defines: list[str], march: str, folder: Path = CSRC, mode: list[str] = FULL
) -> subprocess.CompletedProcess:
    command = [CC, f"-march={march}", *WERROR, *mode, *(f"-D{d}" for d in defines), f"-I{folder}", str(folder / main)]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def _march_supported(march: str) -> bool:
    probe = subprocess.run(
        [CC, f"-march={march}", "-x", "c", "-c", "-o", os.devnull, "-"],
        input="int x;\n",
        capture_output=True,
        text=True,
    )
    return probe.returncode == 0


def _compile_all(marches: list[str], mode: list[str] = FULL) -> list[str]:
    jobs = [(main, defines, march) for march in marches for main, defines in VARIANTS]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda job: (job, _compile(*job, mode=mode)), jobs))
    return [f"{main} {defines} -march={march}:\n{r.stderr}" for (main, defines, march), r in results if r.returncode]


@needs_cc
def test_every_variant_parses_warning_free_for_this_cpu_and_the_other_kinds():
    """Parsed only (a second each): for this CPU and for the other kinds' ``#if`` paths (no SIMD, AVX2
    without VNNI, AVX-512 + AMX). The AMX path once compiled nowhere but on an AMX machine: an ``else``
    under ``#ifdef TK_AMX`` took a declaration for its body, which only the slow tier's builds saw."""
    failed = _compile_all(["native", *(m for m in OTHER_MARCH if _march_supported(m))], SYNTAX)
    assert not failed, "\n".join(failed)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # 32 optimised builds: minutes on a loaded 2-core box
@needs_cc
def test_every_variant_compiles_warning_free_optimised_and_for_other_cpus():
    marches = ["native", *(m for m in OTHER_MARCH if _march_supported(m))]
    if not marches:
        pytest.skip("the compiler targets none of " + ", ".join(OTHER_MARCH))
    failed = _compile_all(marches)
    assert not failed, "\n".join(failed)


def test_no_source_reads_the_environment():
    """Kernel switches are EngineConfig fields, passed in by Python: nothing in C calls getenv."""
    offenders = [p.name for p in CSRC.iterdir() if "getenv" in p.read_text()]
    assert not offenders


def _definitions(folder: Path = CSRC) -> set[str]:
    """Functions defined with external linkage in the .c files (what Python can call)."""
    names = set()
    for path in folder.glob("*.c"):
        for m in re.finditer(r"^(?:int|int64_t|size_t|void|float)\s+(\w+)\s*\([^;{]*\)\s*\{", path.read_text(), re.M):
            if not m.group(1).isupper():  # NAME: the parameter of a defining macro
                names.add(m.group(1))
    return names


def test_every_exported_function_is_declared_in_a_header():
    declared = {name for h in ("paged_decode.h", "quant.h", "fused_decode.h") for name in read(h).functions}
    exported = _definitions()
    # paged_decode_f32/_bf16 are defined by a macro (DEFINE_KERNEL), the compiler checks them against the header
    assert exported <= declared, f"defined in C but not declared in a header: {sorted(exported - declared)}"
    assert {"qk_linear", "fused_decode_f32", "lora_apply_f32", "paged_decode_bf16", "linear_q8"} <= declared


def test_signatures_are_generated_from_the_header():
    header = read("fused_decode.h")
    restype, args = header.functions["fused_draft_f32"]
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    assert restype is ctypes.c_int
    assert args == [
        p,
        p,
        ctypes.c_float,
        ctypes.c_float,
        p,
        p,
        p,
        p,
        p,
        p,
        p,
        ctypes.c_int,
        p,
        i64,
        p,
        i64,
        ctypes.c_float,
        p,
        p,
        p,
    ]
    assert read("quant.h").functions["qk_group_bytes"] == (i64, [ctypes.c_int, i64])
    assert read("quant.h").functions["qk_features"] == (ctypes.c_int, [])


@needs_cc
def test_loaded_libraries_carry_the_headers_signatures():
    lib = fused_library.library("float32")
    if lib is None:
        pytest.skip("the fused library does not build here")
    for name, (restype, args) in read("fused_decode.h").functions.items():
        fn = getattr(lib, name)
        assert fn.restype is restype and list(fn.argtypes) == args, name


def test_the_ctypes_structures_mirror_the_headers():
    structures = [
        (fused_library.LayerRecord, "tk_layer", "fused_decode.h"),
        (fused_library.ModelRecord, "tk_model", "fused_decode.h"),
        (fused_library.QkWeight, "qk_weight", "quant.h"),
        (lora_native._Part, "tk_lora_part", "fused_decode.h"),
        (lora_native._Adapter, "tk_lora_adapter", "fused_decode.h"),
        (lora_native._Step, "tk_lora", "fused_decode.h"),
    ]
    for cls, name, header in structures:
        assert struct_mismatch(cls, read(header), name) is None, name
    assert read("fused_decode.h").defines["TK_LORA_TILE"] == lora_native.TILE


def _copy(tmp_path: Path) -> Path:
    folder = tmp_path / "csrc"
    shutil.copytree(CSRC, folder)
    return folder


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


@needs_cc
def test_a_parameter_type_changed_in_a_header_is_caught(tmp_path):
    """The deliberate mismatch: ``qk_dequantize``'s ``int64_t K`` declared ``int K`` in a copy of quant.h.
    The compiler refuses the definition, and the generated ctypes signature changes with the header."""
    folder = _copy(tmp_path)
    prototype = "int qk_dequantize(int t, const uint8_t *W, int64_t rb, float *y, int64_t nn, int64_t K);"
    _edit(folder / "quant.h", prototype, prototype.replace("int64_t K)", "int K)"))
    r = _compile("quant.c", [], "native", folder)
    assert r.returncode != 0 and "conflicting types for" in r.stderr and "qk_dequantize" in r.stderr
    changed = parse((folder / "quant.h").read_text()).functions["qk_dequantize"][1]
    assert changed[-1] is ctypes.c_int and read("quant.h").functions["qk_dequantize"][1][-1] is ctypes.c_int64


def test_a_struct_field_changed_in_a_header_is_caught(tmp_path):
    folder = _copy(tmp_path)
    _edit(folder / "fused_decode.h", "int64_t window;", "int32_t window;")
    why = struct_mismatch(fused_library.LayerRecord, parse((folder / "fused_decode.h").read_text()), "tk_layer")
    assert why is not None and "window" in why
    _edit(folder / "fused_decode.h", "int64_t r, n, off, t;", "int64_t r, n, t, off;")
    why = struct_mismatch(lora_native._Part, parse((folder / "fused_decode.h").read_text()), "tk_lora_part")
    assert why is not None and "fields" in why


def test_the_parser_refuses_what_it_does_not_read():
    with pytest.raises(HeaderError):
        parse("long double f(int x);")
    with pytest.raises(HeaderError):
        parse("int f(struct s x);")


@needs_cc
def test_the_build_cache_follows_every_included_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENOPS_NATIVE_CACHE", str(tmp_path / "cache"))
    folder = _copy(tmp_path)
    first = native.build_library(main="paged_decode.c", stem="paged_decode", folder=folder)
    assert native.build_library(main="paged_decode.c", stem="paged_decode", folder=folder) == first  # cached
    _edit(folder / "paged_decode.h", "#endif", "/* an edit */\n#endif")
    second = native.build_library(main="paged_decode.c", stem="paged_decode", folder=folder)
    assert second != first and second.is_file()
    fused = [p.name for p in c_header.sources("fused_decode.c")]
    assert fused[0] == "fused_decode.c" and {"lora.c", "fused_step.c"} <= set(fused)
    assert {p.name for p in c_header.sources("fused_decode.c")} >= {"quant.h", "quant_amx.c", "fused_decode.h"}
    lib = bind(ctypes.CDLL(str(second)), read("paged_decode.h"))
    assert lib.linear_q8.restype is ctypes.c_int


def test_the_sources_ship_as_package_data():
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'"tokenops\.engine" = \[[^\]]*"csrc/\*\.c"[^\]]*"csrc/\*\.h"', text)
    assert all(p.suffix in (".c", ".h") for p in CSRC.iterdir())  # the globs take every file


def _asan_runtime() -> str | None:
    if CC is None:
        return None
    path = subprocess.run([CC, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    return path if path and os.path.isabs(path) and os.path.exists(path) else None


@pytest.mark.slow
@pytest.mark.timeout(3600)  # sanitized builds and the kernel tests under them: tens of minutes on a loaded box
def test_kernel_tests_pass_under_address_and_undefined_behaviour_sanitizers(tmp_path):
    """The kernel tests in a process whose libraries are built with ``-fsanitize=address,undefined``
    (``TOKENOPS_NATIVE_SANITIZE=1``): an out-of-bounds access or undefined behaviour fails them."""
    runtime = _asan_runtime()
    if runtime is None:
        pytest.skip("the compiler has no AddressSanitizer runtime")
    env = {
        **os.environ,
        "TOKENOPS_NATIVE_SANITIZE": "1",
        "TOKENOPS_NATIVE_CACHE": str(tmp_path / "cache"),
        "LD_PRELOAD": runtime,
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:exitcode=86",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
    }
    tests = [
        "tests/engine/test_native_attention.py",
        "tests/engine/test_quant_kernels.py",
        "tests/engine/test_lora_native.py",
        "tests/engine/test_fused_decode.py",
    ]
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:xdist",
            "-p",
            "no:cacheprovider",
            "-m",
            "not slow",
            "-x",
            *tests,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=3400,
    )
    tail = (r.stdout + r.stderr)[-6000:]
    assert r.returncode == 0, tail
    assert "AddressSanitizer" not in tail and "runtime error" not in tail, tail
    built = {path.name.rsplit("-", 1)[0] for path in (tmp_path / "cache").glob("*.so")}
    # every library the tests load was built sanitized (a failed build would skip its tests instead)
    assert {"paged_decode", "quant", "quant_plain", "fused_decode"} <= built, built


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_wheel_carries_every_c_source(tmp_path):
    """A built wheel holds csrc's every .c and .h beside the modules that compile them."""
    import zipfile

    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=850,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = tmp_path.glob("tokenops-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"tokenops/engine/csrc/{p.name}" for p in CSRC.iterdir()} <= names
    assert "tokenops/engine/kernels/c_header.py" in names
