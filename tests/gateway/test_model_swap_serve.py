"""``[gateway] max_loaded_models`` through a real ``tokenops serve`` (docs/serve.md, "Models loaded on
demand"): three toy models with one resident at a time, driven by the openai SDK; plus the config
and flag checks."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import openai
import pytest
from tokenops.config import ConfigError, load_settings
from tokenops.testing_serve import ServeProcess

from tests.docs_example_checks import first_toml_block

ROOT = Path(__file__).resolve().parents[2]
MODELS = ["chat", "small", "draft"]


def documented_config() -> str:
    """The block of docs/serve.md's "Models loaded on demand", its paths made absolute."""
    block = first_toml_block(ROOT / "docs" / "serve.md", "## Models loaded on demand")
    assert "max_loaded_models = 1" in block
    return block.replace('path = "tokenops/', f'path = "{ROOT}/tokenops/')


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    missing = tmp_path_factory.mktemp("gone") / "no-such-model"
    config = documented_config() + f'\n[[models]]\nname = "gone"\npath = "{missing}"\n'
    with ServeProcess(tmp_path_factory.mktemp("swap"), config=config, store=False) as srv:
        yield srv


def swap_stats(srv: ServeProcess) -> dict:
    stats = httpx.get(f"{srv.url}/admin/stats", headers=srv.admin_headers).json()
    return {"swap": stats["model_swap"], "resident": {m: stats["models"][m].get("resident") for m in MODELS}}


def ask(client: openai.OpenAI, model: str) -> str:
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert r.model == model
    return r.choices[0].message.content or ""


def test_alternating_models_load_and_evict_one_at_a_time(server):
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    assert sorted(m.id for m in client.models.list()) == sorted([*MODELS, "gone"])  # resident or not
    assert swap_stats(server)["resident"] == {"chat": True, "small": False, "draft": False}  # the first at start
    before = swap_stats(server)["swap"]
    for model in ["small", "chat", "draft", "draft", "small"]:
        ask(client, model)
        assert [m for m, up in swap_stats(server)["resident"].items() if up] == [model]
    after = swap_stats(server)["swap"]
    assert after["num_loads"] - before["num_loads"] == 4  # the second "draft" found it resident
    assert after["num_evictions"] - before["num_evictions"] == 4
    assert after["load_seconds"] > before["load_seconds"] and after["resident"] == ["small#0"]


def test_concurrent_requests_to_different_models_all_succeed(server):
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)

    async def run() -> list[str]:
        async def one(i: int) -> str:
            r = await client.completions.create(model=MODELS[i % 3], prompt=f"note {i}", max_tokens=6, temperature=0)
            assert r.model == MODELS[i % 3] and r.usage.completion_tokens == 6
            return r.model

        try:
            return await asyncio.gather(*(one(i) for i in range(12)))
        finally:
            await client.close()

    before = swap_stats(server)["swap"]
    assert sorted(asyncio.run(run())) == sorted(MODELS * 4)
    after = swap_stats(server)["swap"]
    # each model's requests share a load (one per model at a time): at most one load per model here
    # plus reloads of one that had to make room; never one per request
    assert 2 <= after["num_loads"] - before["num_loads"] <= 6
    assert after["waiting"] == 0 and after["loading"] == [] and len(after["resident"]) == 1


def test_a_model_that_cannot_load_fails_alone(server):
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    for _ in range(2):  # on demand, then failed for good: the same 503 with the cause
        with pytest.raises(openai.APIStatusError) as info:
            ask(client, "gone")
        assert info.value.status_code == 503 and info.value.body["code"] == "model_load_failed"
        assert "no-such-model" in info.value.message and "not found" in info.value.message
    ready = httpx.get(server.url + "/ready").json()
    assert ready["ready"] is True and list(ready["failed"]) == ["gone"]
    assert ask(client, "chat") is not None  # the others keep serving
    assert swap_stats(server)["swap"]["num_load_failures"] == 1


def test_max_loaded_models_is_checked(tmp_path):
    path = tmp_path / "tokenops.toml"
    path.write_text("[gateway]\nmax_loaded_models = -1\n")
    with pytest.raises(ConfigError, match="max_loaded_models must be >= 0"):
        load_settings(path, environ={})
    path.write_text("")
    assert load_settings(path, environ={"TOKENOPS_GATEWAY__MAX_LOADED_MODELS": "2"}).gateway.max_loaded_models == 2


def test_serve_flag_sets_the_bound(monkeypatch):
    from tokenops.cli import main
    from tokenops.gateway import server

    seen = []
    monkeypatch.setattr(server, "run_server", lambda settings, **kw: seen.append(settings.gateway.max_loaded_models))
    with pytest.raises(SystemExit) as e:
        main(["serve", "--no-store", "--max-loaded-models", "2"])
    assert e.value.code == 0 and seen == [2]
    with pytest.raises(SystemExit) as e:
        main(["serve", "--no-store", "--max-loaded-models", "-1"])
    assert e.value.code == 2


def test_dashboard_models_table_shows_what_is_loaded(server):
    from tokenops.tui.screens.models import model_cells, models_title

    stats = httpx.get(f"{server.url}/admin/stats", headers=server.admin_headers).json()
    names = {m: model_cells(m, stats["models"][m])[0] for m in MODELS}
    resident = [m for m in MODELS if stats["models"][m]["resident"]]
    assert len(resident) == 1 and names[resident[0]] == resident[0]
    assert all(names[m] == f"{m} (not loaded)" for m in MODELS if m not in resident)
    title = models_title(stats["model_swap"])
    assert title.startswith("models: 1 of at most 1 engines loaded, ") and " evictions, " in title
    assert models_title(None) == "models"


def test_runtime_adapter_refuses_a_base_loaded_on_demand(server):
    r = httpx.post(
        f"{server.url}/admin/lora", headers=server.admin_headers, json={"name": "x", "path": "/tmp", "base": "chat"}
    )
    assert r.status_code == 400 and "max_loaded_models" in r.json()["error"]["message"]


def test_tokenize_loads_a_model_that_is_not_resident(server):
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    ask(client, "chat")
    assert swap_stats(server)["resident"]["small"] is False
    r = httpx.post(f"{server.url}/tokenize", json={"model": "small", "prompt": "hello there"})
    assert r.status_code == 200 and r.json()["count"] > 0
    assert swap_stats(server)["resident"] == {"chat": False, "small": True, "draft": False}
    r = httpx.post(f"{server.url}/detokenize", json={"model": "chat", "tokens": r.json()["tokens"]})
    assert r.status_code == 200 and "hello" in r.json()["prompt"]
    r = httpx.post(f"{server.url}/tokenize", json={"model": "gone", "prompt": "hi"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_load_failed"


def test_the_real_default_model_swaps_with_the_same_greedy_answers(tmp_path):
    """SmolLM2-135M-Instruct's GGUF served as two models under ``max_loaded_models = 1``: each request
    swaps, and each model answers greedily as it did before it was evicted and loaded again."""
    from tests.real_model import SERVE_ENV, gguf_path, serve_args

    serve_args()  # skips without the default model's package
    config = "[gateway]\nmax_loaded_models = 1\n" + "".join(
        f'\n[[models]]\nname = "{name}"\npath = "{gguf_path()}"\n' for name in ("left", "right")
    )
    question = [{"role": "user", "content": "What is the capital of France?"}]
    with ServeProcess(tmp_path, config=config, env=SERVE_ENV, store=False) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
        answers = [
            client.chat.completions.create(model=m, messages=question, max_tokens=12, temperature=0)
            .choices[0]
            .message.content
            for m in ("left", "right", "left", "right")
        ]
        swap = httpx.get(f"{srv.url}/admin/stats", headers=srv.admin_headers).json()["model_swap"]
    assert "Paris" in answers[0] and answers == [answers[0]] * 4, answers
    assert swap["num_loads"] >= 4 and swap["num_evictions"] >= 3, swap
