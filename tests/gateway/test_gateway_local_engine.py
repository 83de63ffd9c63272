"""The ``local`` backend on the real bundled engine (embedded default model, tiny KV cache)."""

from __future__ import annotations

import httpx
import openai
import pytest

from tokenops.config import EngineSettings, Settings

pytest.importorskip("torch")


def _settings() -> Settings:
    return Settings(engine=EngineSettings(kv_cache_tokens=1024, max_num_seqs=4, max_num_batched_tokens=256,
                                          torch_threads=1))


async def test_openai_client_on_the_bundled_engine():
    from tokenops.backends.registry import model_configs
    from tokenops.gateway.app import create_app
    from tokenops.gateway.auth import hash_key

    settings = _settings()
    name = model_configs(settings)[0].name
    app = create_app(settings, admin_key_hash=hash_key("k"))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost", timeout=120) as c:
            assert (await c.get("/health")).status_code == 200  # while the model loads
            await app.state.gateway.wait_started()
            assert (await c.get("/ready")).status_code == 200
            cards = (await c.get("/v1/models")).json()["data"]
            assert cards[0]["id"] == name and cards[0]["max_model_len"] == 1024
            assert cards[0].get("random_weights") is (True if name == "tokenops-random-llama" else None)
            client = openai.AsyncOpenAI(base_url="http://localhost/v1", api_key="x", http_client=c, max_retries=0)

            prompt = [{"role": "user", "content": "tell me a story about " + "a cat and a dog " * 8}]  # > 1 KV block
            r = await client.chat.completions.create(model=name, messages=prompt,
                                                     max_tokens=6, temperature=0, logprobs=True, top_logprobs=2,
                                                     extra_body={"ignore_eos": True})
            assert r.usage.completion_tokens == 6 and r.choices[0].finish_reason == "length"
            assert len(r.choices[0].logprobs.content) == 6
            assert len(r.choices[0].logprobs.content[0].top_logprobs) == 2
            again = await client.chat.completions.create(model=name, messages=prompt,
                                                         max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
            assert again.choices[0].message.content == r.choices[0].message.content  # greedy is deterministic
            assert again.usage.prompt_tokens_details.cached_tokens > 0  # the prompt's full blocks were reused
            other = await client.chat.completions.create(model=name, messages=prompt, max_tokens=2, user="tenant-b")
            assert other.usage.prompt_tokens_details.cached_tokens == 0  # the tenant salts the prefix cache

            stream = await client.completions.create(model=name, prompt="hello", max_tokens=5, stream=True, seed=3, logprobs=0,
                                                     stream_options={"include_usage": True},
                                                     extra_body={"ignore_eos": True})
            chunks = [ch async for ch in stream]
            token_chunks = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason is None]
            # one chunk per engine step, token by token (logprobs make chunks of partial UTF-8 bytes visible)
            assert [len(ch.choices[0].logprobs.tokens) for ch in token_chunks] == [1] * 5
            assert chunks[-1].usage.completion_tokens == 5

            two = await client.completions.create(model=name, prompt="hello", max_tokens=3, n=2, seed=5,
                                                  extra_body={"ignore_eos": True})
            assert sorted(c.index for c in two.choices) == [0, 1] and two.usage.completion_tokens == 6

            with pytest.raises(openai.BadRequestError) as e:
                await client.completions.create(model=name, prompt="word " * 1200, max_tokens=4)
            assert e.value.body["code"] == "context_length_exceeded"

            stats = (await c.get("/admin/stats", headers={"Authorization": "Bearer k"})).json()
            engine = stats["engines"][f"{name}#0"]
            assert engine["total_generation_tokens"] >= 17 and engine["kv_blocks_total"] == 64
            metrics = (await c.get("/metrics")).text
            assert f'tokenops:prefix_cache_hits_total{{model_name="{name}"}}' in metrics
            r = await c.patch("/admin/tunables", headers={"Authorization": "Bearer k"},
                              json={"values": {"engine.max_num_seqs": 2}})
            assert r.status_code == 200
            assert app.state.gateway.replicas[name][0].backend.engine.engine.config.max_num_seqs == 2
