"""Two gateways in one process build their engines with their own engine-level plugins: each
``create_app`` has its own ``kv_policy``, ``speculative`` (ngram_proposer) and ``reasoning_budget``
instances, configured from its own ``[plugins.*]``, and the engine built on its own thread
(``AsyncLLMEngine.build_on_engine_thread``) gets that gateway's proposer sizes, not the process's.
In-process (httpx's ASGI transport), real bundled engines on the demo target model."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from tokenops.config import EngineSettings, ModelConfig, Settings
from tokenops.plugin_manager import get_plugin_manager
from tokenops.testing_gateway import gateway_client
from tokenops.types import GatewayRequest, OutputFields

pytest.importorskip("torch")

TARGET = Path(__file__).resolve().parents[2] / "tokenops" / "demo_models" / "target"
pytestmark = pytest.mark.skipif(not (TARGET / "model.safetensors").exists(), reason="demo models not built")


def _settings(plugins: dict) -> Settings:
    engine = EngineSettings(kv_cache_tokens=1024, max_num_seqs=2, max_num_batched_tokens=256, torch_threads=1)
    return Settings(engine=engine, models=[ModelConfig(name="m", path=str(TARGET))], plugins=plugins)


WINDOWED = {
    "kv_policy": {"sink_tokens": 4, "window_tokens": 64},
    "speculative": {"method": "ngram", "num_tokens": 2, "min_ngram": 1, "max_ngram": 2},
    "reasoning_budget": {"low": 5},
}
INT8 = {
    "kv_policy": {"cache_dtype": "int8"},
    "speculative": {"method": "ngram", "num_tokens": 3, "min_ngram": 3, "max_ngram": 5},
    "reasoning_budget": {"low": 9},
}


async def test_each_gateway_builds_its_engine_with_its_own_engine_plugins():
    async with gateway_client(None, _settings(WINDOWED)) as a, gateway_client(None, _settings(INT8)) as b:
        # one instance per gateway for each engine-level plugin, neither the process's
        for name in (
            "kv_policy",
            "ngram_proposer",
            "reasoning_budget",
            "kv_offload",
            "step_cache",
            "compile",
            "profile_telemetry",
        ):
            mine = a.gateway.plugins.get_plugin(name), b.gateway.plugins.get_plugin(name)
            assert len({id(mine[0]), id(mine[1]), id(get_plugin_manager().get_plugin(name))}) == 3, name
        assert a.gateway.plugins.get_plugin("kv_policy").conf["window_tokens"] == 64
        assert b.gateway.plugins.get_plugin("kv_policy").conf == {
            "sink_tokens": 0,
            "window_tokens": 0,
            "cache_dtype": "int8",
        }
        assert get_plugin_manager().get_plugin("kv_policy").conf["window_tokens"] == 0  # untouched

        # the engine config each gateway built (tokenops_engine_config, in its own set)
        backend_a, backend_b = a.gateway.replicas["m"][0].backend, b.gateway.replicas["m"][0].backend
        config_a, config_b = backend_a.engine.engine.config, backend_b.engine.engine.config
        assert (config_a.kv_window_tokens, config_a.kv_sink_tokens, config_a.kv_cache_dtype) == (64, 4, "auto")
        assert (config_b.kv_window_tokens, config_b.kv_cache_dtype) == (0, "int8")
        assert (config_a.num_speculative_tokens, config_b.num_speculative_tokens) == (2, 3)

        # the proposer is built on the engine's own thread: it still got its gateway's sizes
        proposer_a = backend_a.engine.engine.spec_decoder.proposer
        proposer_b = backend_b.engine.engine.spec_decoder.proposer
        assert (proposer_a.min_ngram, proposer_a.max_ngram) == (1, 2)
        assert (proposer_b.min_ngram, proposer_b.max_ngram) == (3, 5)

        # the per-request budget policy the backend asks is its gateway's (called here, outside both)
        low = GatewayRequest(
            kind="chat",
            model="m",
            body={},
            messages=[{"role": "user", "content": "hi"}],
            output=OutputFields(reasoning_effort="low"),
        )
        assert backend_a.calls.reasoning_budget(low, "m").max_thinking_tokens == 5
        assert backend_b.calls.reasoning_budget(low, "m").max_thinking_tokens == 9

        # and both answer a real client, greedy and the same text (speculation and the window do not
        # change a short greedy answer; int8 KV may, so only its length is compared)
        answers = []
        for client in (a, b):
            sdk = openai.AsyncOpenAI(base_url="http://localhost/v1", api_key="x", http_client=client, max_retries=0)
            r = await sdk.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "count: 1 2 3"}],
                max_tokens=6,
                temperature=0,
                extra_body={"ignore_eos": True},
            )
            answers.append(r)
        assert [r.usage.completion_tokens for r in answers] == [6, 6]

        # each gateway's running profile learned from its own request only
        running = [client.gateway.plugins.get_plugin("profile_telemetry").running_stats("m") for client in (a, b)]
        assert all(stats.get("error_rate") == 0.0 for stats in running), running
        a.gateway.plugins.get_plugin("profile_telemetry").reset()
        assert b.gateway.plugins.get_plugin("profile_telemetry").running_stats("m") == running[1]
