"""A grammar compiles off the hot path: while one request's schema compiles, the
engine keeps serving the others (the local backend, in-process, on the demo model)."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

from tokenops.backends.local import LocalBackend
from tokenops.config import ModelConfig, Settings
from tokenops.gateway.openai.schemas import chat_request

DEMO = Path(__file__).resolve().parents[2] / "tokenops" / "demo_models" / "target"


async def test_a_slow_compile_makes_only_its_own_request_wait():
    backend = LocalBackend(ModelConfig(name="demo", path=str(DEMO)), Settings())
    await backend.start()
    try:
        compiler = backend.engine.grammar_compiler
        compile_now, release, returned = compiler.compile, threading.Event(), threading.Event()

        def slow_compile(spec):
            release.wait(30)  # held until the plain request has been answered (or 30 s)
            returned.set()
            return compile_now(spec)

        compiler.compile = slow_compile
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
        constrained = asyncio.create_task(
            backend.chat(
                chat_request(
                    {
                        "model": "demo",
                        "messages": [{"role": "user", "content": "ok?"}],
                        "max_tokens": 16,
                        "response_format": {"type": "json_schema", "json_schema": {"name": "ok", "schema": schema}},
                    },
                    16,
                )
            )
        )
        await asyncio.sleep(0.1)
        plain = await backend.chat(
            chat_request(
                {
                    "model": "demo",
                    "messages": [{"role": "user", "content": "hello"}],
                    "max_tokens": 4,
                    "ignore_eos": True,
                },
                16,
            )
        )
        # answered while the compile was still held: it blocked neither the event loop nor the engine
        assert plain.completion_tokens == 4 and not returned.is_set() and not constrained.done()
        release.set()
        answer = await asyncio.wait_for(constrained, 60)
        assert isinstance(json.loads(answer.text)["ok"], bool)
    finally:
        await backend.close()
