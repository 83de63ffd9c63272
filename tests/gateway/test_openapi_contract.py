"""The OpenAPI document tells the truth: schemathesis (every check) against a real
``tokenops serve`` finds nothing, and the declarations the hardening issue named
are in the document.

The default run is bounded (a few examples per operation, a fixed seed); the slow
run goes further. Both drive the server with a key that is both the admin key and
an API key, so every operation is reachable.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tokenops.engine.models.default_model import shipped_model_dir
from tokenops.testing_serve import ServeProcess

KEY = "contract-key-123"
CONFIG = Path(__file__).with_name("schemathesis.toml")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    config = f'[gateway]\napi_keys = {{ "{KEY}" = "acme" }}\n'
    with ServeProcess(tmp_path_factory.mktemp("contract"), config=config, admin_key=KEY,
                      args=["--model", str(shipped_model_dir())]) as srv:
        yield srv


def _schemathesis(srv: ServeProcess, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    pytest.importorskip("schemathesis", reason="schemathesis is a dev dependency (pip install -e '.[dev]')")
    return subprocess.run([sys.executable, "-m", "schemathesis.cli", "--config-file", str(CONFIG), "run", f"{srv.url}/openapi.json",
                           "-H", f"Authorization: Bearer {KEY}", "--no-color", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=900)


def _failures(result: subprocess.CompletedProcess) -> str:
    """The report's failures section (what to fix), then its summary."""
    out = result.stdout
    start = out.find("=== FAILURES ===")
    end = out.find("=== WARNINGS ===", start)
    return (out[start:end][:12000] if start >= 0 else "") + out[-3000:] + result.stderr[-2000:]


def test_schemathesis_with_every_check_finds_nothing(served, tmp_path):
    result = _schemathesis(served, tmp_path, "--max-examples", "3", "--seed", "42", "--phases",
                           "examples,coverage,fuzzing")
    assert result.returncode == 0, _failures(result)


@pytest.mark.slow
def test_schemathesis_deeper_run_finds_nothing(served, tmp_path):
    result = _schemathesis(served, tmp_path, "--max-examples", "100")
    print(result.stdout[-1500:])  # the summary: operations, test cases, phases (pytest -s shows it)
    assert result.returncode == 0, _failures(result)


def test_the_document_declares_what_the_server_enforces(served):
    doc = httpx.get(f"{served.url}/openapi.json").json()
    paths, schemas = doc["paths"], doc["components"]["schemas"]
    assert list(paths["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]
    limit = next(p for p in paths["/admin/requests"]["get"]["parameters"] if p["name"] == "limit")
    assert limit["schema"]["minimum"] == 1
    tenant = next(p for p in paths["/admin/distill/pairs"]["delete"]["parameters"] if p["name"] == "tenant")
    assert tenant["required"] is True
    chat = schemas["ChatCompletionRequest"]
    assert chat["then"]["properties"]["logprobs"] == {"const": True}  # top_logprobs needs logprobs
    assert chat["properties"]["seed"]["anyOf"][0]["maximum"] == 2**63 - 1
    image = paths["/v1/images/generations"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert image["properties"]["step_cache_threshold"]["anyOf"][0]["type"] == "number"
    admin = httpx.Client(base_url=served.url, headers={"authorization": f"Bearer {KEY}"})
    # an undeclared method is a 405 naming every declared one, whatever the content type
    r = admin.request("OPTIONS", "/admin/distill/pairs")
    assert r.status_code == 405 and set(r.headers["allow"].split(", ")) >= {"GET", "DELETE"}
    r = admin.put("/v1/models", content=b"x", headers={"content-type": "text/plain"})
    assert r.status_code == 405
    assert admin.delete("/admin/distill/pairs").status_code == 400
    assert admin.post("/v1/images/generations", json={"prompt": "a 3", "step_cache_threshold": False}).status_code == 400
