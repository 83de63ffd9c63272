"""Issue 51 (Hardening III, part 2) against a real ``tokenops serve`` of the default model (SmolLM2):
a client that leaves cancels its request on every route and the engine frees it; a model's queue
is bounded (429 with Retry-After; 529 overloaded_error on /v1/messages) and fair across tenants;
SIGTERM drains until ``[gateway] drain_timeout_s`` and the server exits.

The server runs 4 requests at once (``[engine] max_num_seqs = 4``) and queues 8 more."""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import time

import anthropic
import httpx
import openai
import pytest

from tests.real_model import MODEL, SERVE_ENV, serve_args
from tests.serve_configs import config as serve_config, section
from tokenops.testing_serve import ServeProcess

SLOTS, QUEUED = 4, 8
LONG = {"max_tokens": 3000, "extra_body": {"ignore_eos": True}}  # minutes of decoding on this box
STORY = [{"role": "user", "content": "Tell me a long story."}]


def _config(drain_timeout_s: float = 30.0) -> str:
    return serve_config(
        section(
            "gateway",
            max_queued_requests=QUEUED,
            max_connections_per_client=1024,  # the burst's 300 clients share one address
            drain_timeout_s=drain_timeout_s,
        ),
        section("engine", max_num_seqs=SLOTS),
    )


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with ServeProcess(
        tmp_path_factory.mktemp("cancel_queue"), config=_config(), args=serve_args(), env=SERVE_ENV, store=False
    ) as srv:
        yield srv


def _stats(srv: ServeProcess) -> dict:
    return httpx.get(f"{srv.url}/admin/stats", headers=srv.admin_headers, timeout=30).json()


def _running(srv: ServeProcess) -> int:
    return sum(s.get("num_running", 0) for name, s in _stats(srv)["engines"].items() if name.startswith(MODEL))


def _disconnected(srv: ServeProcess) -> int:
    return _stats(srv)["models"].get(MODEL, {}).get("disconnected", 0)


def _idle_within(srv: ServeProcess, seconds: float) -> float:
    """Seconds until the engine runs nothing (fails past ``seconds``)."""
    start = time.monotonic()
    while _running(srv) > 0:
        assert time.monotonic() - start < seconds, f"still running {seconds} s after the clients left"
        time.sleep(0.05)
    return time.monotonic() - start


def _wait_running(srv: ServeProcess, n: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _running(srv) < n:
        assert time.monotonic() < deadline, f"fewer than {n} requests running after {timeout_s} s"
        time.sleep(0.1)


def _leave_after(call, seconds: float) -> None:
    """Run ``call(timeout)``; the client gives up (closes its connection) after ``seconds``."""
    with pytest.raises((openai.APITimeoutError, anthropic.APITimeoutError)):
        call(seconds)


def _openai(srv: ServeProcess, timeout: float) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=timeout)


def _anthropic(srv: ServeProcess, timeout: float) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0, timeout=timeout)


def _leave_together(calls, seconds: float) -> None:
    """Every call at once, each client leaving after ``seconds``."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(calls)) as pool:
        for future in [pool.submit(_leave_after, call, seconds) for call in calls]:
            future.result()


def test_clients_that_leave_free_the_engine_on_every_route(served):
    """One non-streamed request per route, each client leaving after 3 s: all cancelled (499), the engine idle."""
    before = _disconnected(served)
    calls = [
        lambda t: _openai(served, t).chat.completions.create(model=MODEL, messages=STORY, **LONG),
        lambda t: _openai(served, t).completions.create(model=MODEL, prompt="Once upon a time", **LONG),
        lambda t: _openai(served, t).responses.create(
            model=MODEL, input="Tell me a long story.", max_output_tokens=3000, extra_body={"ignore_eos": True}
        ),
        lambda t: _anthropic(served, t).messages.create(  # no ignore_eos on Messages: a long greedy answer
            # greedy repetition runs past 8 s here; sampled counting sometimes ended within 3 s (CI failed on it)
            model=MODEL, messages=[{"role": "user", "content": "Repeat the word hello 2000 times."}],
            max_tokens=3000, extra_body={"temperature": 0},
        ),
    ]
    _leave_together(calls, 3.0)
    took = _idle_within(served, 4.0)
    print(f"engine idle {took:.2f} s after 4 clients (chat, completions, responses, messages) left")
    deadline = time.monotonic() + 10
    while _disconnected(served) < before + len(calls) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _disconnected(served) == before + len(calls)  # recorded as 499 "disconnected", one per route


@pytest.mark.slow
def test_eight_abandoned_3000_token_chats_free_the_engine_within_2_s(served):
    calls = [
        lambda t: _openai(served, t).chat.completions.create(model=MODEL, messages=STORY, **LONG) for _ in range(8)
    ]
    _leave_together(calls, 3.0)
    took = _idle_within(served, 2.0)
    print(f"engine idle {took:.2f} s after 8 clients left")
    r = _openai(served, 60).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                    max_tokens=2)
    assert r.choices[0].finish_reason in ("length", "stop")  # a fresh request is answered at once


async def _burst(srv: ServeProcess, n: int) -> list[tuple[int, str | None, str | None]]:
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=n + 10), timeout=300) as client:

        async def one() -> tuple[int, str | None, str | None]:
            r = await client.post(f"{srv.base_url}/chat/completions", json={
                "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
            code = r.json()["error"]["code"] if r.status_code != 200 else None
            return r.status_code, r.headers.get("retry-after"), code

        return await asyncio.gather(*(one() for _ in range(n)))


def test_a_burst_past_the_queue_bound_gets_429_with_retry_after_and_the_rest_is_served(served):
    results = asyncio.run(_burst(served, 300))
    statuses = collections.Counter(status for status, _, _ in results)
    print(f"300 clients: {dict(statuses)}")
    assert set(statuses) == {200, 429}, statuses  # within the bound: served; past it: refused, nothing else
    assert statuses[200] >= SLOTS + QUEUED
    refused = [(ra, code) for status, ra, code in results if status == 429]
    assert all(code == "queue_full" and ra is not None and int(ra) >= 1 for ra, code in refused)
    admission = _stats(served)["admission"][MODEL]
    assert admission["waiting"] == 0 and admission["running"] == 0 and admission["rejected"] >= len(refused)


def test_a_full_queue_makes_room_for_another_tenant_and_messages_get_529(served):
    """Tenant "default" fills the slots and the queue (its next request, on /v1/messages, is a 529);
    tenant b still gets in (default's newest waiting request is refused instead), and is served once
    default's clients leave."""

    async def scenario() -> None:
        async with httpx.AsyncClient(timeout=300) as client:

            def ask(tenant: str | None, max_tokens: int = 3000) -> asyncio.Task:
                # a keyless server takes the tenant from the body's user (tenant "default" without it)
                body = {"model": MODEL, "messages": STORY, "max_tokens": max_tokens, "ignore_eos": True,
                        **({"user": tenant} if tenant else {})}
                return asyncio.ensure_future(client.post(f"{served.base_url}/chat/completions", json=body))

            a = [ask(None) for _ in range(SLOTS + QUEUED)]
            while _stats(served)["admission"].get(MODEL, {}).get("waiting", 0) < QUEUED:
                await asyncio.sleep(0.1)
            with pytest.raises(anthropic.InternalServerError) as full:  # OverloadedError is its subclass
                await asyncio.to_thread(lambda: _anthropic(served, 60).messages.create(
                    model=MODEL, messages=STORY, max_tokens=8))  # tenant "default" too: the longest queue
            assert full.value.status_code == 529 and full.value.body["error"]["type"] == "overloaded_error"
            b = ask("b", max_tokens=4)
            done, _ = await asyncio.wait(a, timeout=30, return_when=asyncio.FIRST_COMPLETED)
            pushed_out = [t.result() for t in done]
            assert [r.status_code for r in pushed_out] == [429] and "another tenant" in pushed_out[0].text
            for t in a:  # a's clients leave: b takes a slot
                t.cancel()
            await asyncio.gather(*a, return_exceptions=True)
            assert (await asyncio.wait_for(b, 60)).status_code == 200

    asyncio.run(scenario())
    _idle_within(served, 4.0)


def test_sigterm_drains_until_the_deadline_then_exits(tmp_path):
    drain_s = 3.0
    with ServeProcess(tmp_path, config=_config(drain_s), args=serve_args(), env=SERVE_ENV, store=False) as srv:
        client = _openai(srv, 120)

        def whole() -> object:
            try:
                return client.chat.completions.create(model=MODEL, messages=STORY, **LONG)
            except openai.APIStatusError as e:
                return e

        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(2) as pool:
            answers = [pool.submit(whole) for _ in range(2)]
            _wait_running(srv, 2)
            assert srv.proc is not None
            start = time.monotonic()
            os.kill(srv.proc.pid, signal.SIGTERM)
            code = srv.proc.wait(timeout=60)
            took = time.monotonic() - start
            print(f"exited {took:.2f} s after SIGTERM (drain_timeout_s = {drain_s})")
            assert code == 0 and took < drain_s + 8.0
            for answer in answers:  # cut at the deadline: a 503 the client can retry elsewhere
                err = answer.result()
                assert isinstance(err, openai.APIStatusError) and err.status_code == 503
                assert err.code == "shutting_down"
