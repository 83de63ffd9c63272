"""docs/deploy.md as written: its HAProxy config (copied from the page, addresses pointed at two
real ``tokenops serve`` processes) in front of two gateways that share Redis and PostgreSQL through
the page's ``tokenops.toml`` block. The openai SDK talks to HAProxy only: the turns of a Responses
conversation alternate between the gateways (HAProxy's ``X-Tokenops-Gateway`` header says which),
one gateway is killed with SIGKILL, and the conversation goes on through the other."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from tokenops.testing_postgres import PostgresUnavailable, postgres_server
from tokenops.testing_serve import RedisUnavailable, ServeProcess, free_port, redis_server

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "tokenops" / "demo_models" / "target"
DOC = (ROOT / "docs" / "deploy.md").read_text()


def _block(language: str, first: str) -> str:
    [block] = [b for b in re.findall(rf"```{language}\n(.*?)```", DOC, flags=re.S) if b.startswith(first)]
    return block


def haproxy_config(port: int, gateways: list[ServeProcess]) -> str:
    text = _block("haproxy", "global")
    text = text.replace("bind 127.0.0.1:8080", f"bind 127.0.0.1:{port}")
    servers = re.findall(r"^    server (\S+) \S+ check$", text, flags=re.M)
    assert len(servers) == len(gateways) == 2
    for name, srv in zip(servers, gateways):
        text = re.sub(rf"server {name} \S+ check", f"server {name} 127.0.0.1:{srv.port} check", text)
    return text


def gateway_config(redis_url: str, postgres_url: str) -> str:
    text = _block("toml", "[shared]")
    text = text.replace("redis://redis.internal:6379/0", redis_url)
    text = text.replace("postgresql+psycopg://tokenops@db.internal:5432/tokenops", postgres_url)
    assert "internal" not in text
    return f'[[models]]\nname = "demo"\npath = "{DEMO}"\n\n' + text


@contextlib.contextmanager
def haproxy(config: str, workdir: Path, port: int):
    binary = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
    if binary is None:
        pytest.skip("no haproxy binary (make haproxy, or apt-get install -y haproxy)")
    path = workdir / "haproxy.cfg"
    path.write_text(config)
    subprocess.run([binary, "-c", "-f", str(path)], check=True, capture_output=True)
    proc = subprocess.Popen([binary, "-db", "-f", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:  # ready once both gateways pass their health check
            with contextlib.suppress(httpx.HTTPError):
                seen = {httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).headers.get("x-tokenops-gateway")
                        for _ in range(4)}
                if len(seen) == 2:
                    break
            assert time.monotonic() < deadline and proc.poll() is None, "haproxy did not come up"
            time.sleep(0.2)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    with contextlib.ExitStack() as stack:
        try:
            redis_url = stack.enter_context(redis_server(tmp_path_factory.mktemp("redis")))
            postgres_url = stack.enter_context(postgres_server())
        except (RedisUnavailable, PostgresUnavailable) as e:
            pytest.skip(str(e))
        config = gateway_config(redis_url, postgres_url)
        gateways = [ServeProcess(tmp_path_factory.mktemp(f"gw_{n}"), config=config) for n in "ab"]
        for srv in gateways:
            stack.callback(srv.stop)
        with ThreadPoolExecutor(2) as pool:
            for f in [pool.submit(s.start) for s in gateways]:
                f.result()
        port = free_port()
        stack.enter_context(haproxy(haproxy_config(port, gateways), tmp_path_factory.mktemp("haproxy"), port))
        yield port, gateways


def test_a_conversation_through_haproxy_survives_a_killed_gateway(deployment):
    port, (a, b) = deployment
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)

    def turn(text: str, previous: str | None):
        started = time.monotonic()
        raw = client.responses.with_raw_response.create(model="demo", input=text, previous_response_id=previous,
                                                        max_output_tokens=8, temperature=0)
        print(f"{text!r}: {time.monotonic() - started:.2f} s on {raw.headers['x-tokenops-gateway']}")
        return raw.parse(), raw.headers["x-tokenops-gateway"]

    first, on_first = turn("My name is Ada.", None)
    second, on_second = turn("What is my name?", first.id)
    assert {on_first, on_second} == {"gateway-a", "gateway-b"}  # round robin: one turn on each
    victim = a if on_second == "gateway-a" else b
    victim.proc.kill()  # SIGKILL between turns
    victim.proc.wait(timeout=30)
    survivor = "gateway-b" if victim is a else "gateway-a"
    served = []
    previous = second.id
    for text in ("Say it again.", "And once more.", "Done."):  # a refused connection is retried on the survivor
        response, on = turn(text, previous)
        served.append(on)
        previous = response.id
    assert served == [survivor] * 3
    items = client.responses.input_items.list(previous, order="asc", limit=100).data
    users = [i.content[0].text for i in items if i.type == "message" and i.role == "user"]
    assert users == ["My name is Ada.", "What is my name?", "Say it again.", "And once more.", "Done."]
