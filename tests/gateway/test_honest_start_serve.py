"""An honest start, against a real ``tokenops serve`` (issue 50, part 4): while a model loads it is
not in ``/v1/models`` (``GET /v1/models/{id}`` says ``loading``, ``/ready`` names it), a model whose
load failed shows as failed with its cause, the log says "loading", then "loaded", then "ready"
before "tokenops serving" (which names only the models that answer), and a server left with
nothing to serve exits at once with one line naming the model and why.

The models are a plugin backend (tests/gateway/gated_backend_plugin.py) whose start waits for a
file: the test decides when loading ends, so nothing here depends on how fast the machine is."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from tests.serve_configs import config as serve_config
from tests.serve_configs import model
from tokenops.testing_serve import ServeProcess

PLUGIN = str(Path(__file__).with_name("gated_backend_plugin.py"))
CAUSE = "weights are corrupt (test)"


class Output:
    """A serve process's merged stdout/stderr, each line with the monotonic time it arrived."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[tuple[float, str]] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def join(self) -> None:
        self._thread.join(timeout=30)

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def index(self, prefix: str) -> int:
        """The index of the first line starting with ``prefix`` (a failed assertion shows the log)."""
        found = [i for i, (_, line) in enumerate(self.lines) if line.startswith(prefix)]
        assert found, f"no line starting with {prefix!r} in:\n{self.text()}"
        return found[0]


def start(workdir: Path, config: str) -> tuple[ServeProcess, subprocess.Popen, Output]:
    """``tokenops serve`` started without waiting for /ready (a model here may never load)."""
    import os

    srv = ServeProcess(workdir, config=config, store=False)
    env = dict(os.environ, TOKENOPS_PLUGINS=PLUGIN, TOKENOPS_ADMIN_KEY=srv.admin_key)
    proc = subprocess.Popen(srv.command(), cwd=workdir, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    return srv, proc, Output(proc)


def wait_for(url: str, proc: subprocess.Popen, out: Output, status: int = 200, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"serve exited with {proc.returncode}:\n{out.text()}"
        try:
            if httpx.get(url, timeout=2).status_code == status:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} not {status} within {timeout_s} s:\n{out.text()}")


def stop(proc: subprocess.Popen, out: Output) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    out.join()


@pytest.fixture(scope="module")
def serving(tmp_path_factory):
    """quick (loads at once), slow (loads when the gate file appears), broken (fails at once) and
    a lazily loaded embedding model (can answer: its first request loads it)."""
    workdir = tmp_path_factory.mktemp("honest-start")
    gate = workdir / "gate"
    config = serve_config(
        model("quick", backend="gated"),
        model("slow", backend="gated", engine={"gate": str(gate)}),
        model("broken", backend="gated", engine={"fail": CAUSE}),
        model("all-minilm-l6-v2", backend="embedding", engine={"load": "lazy"}),
    )
    srv, proc, out = start(workdir, config)
    try:
        wait_for(srv.url + "/health", proc, out)
        yield srv, proc, out, gate
    finally:
        stop(proc, out)


def test_a_loading_model_is_not_listed_until_it_can_answer(serving):
    srv, proc, out, gate = serving
    client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
    deadline = time.monotonic() + 60  # quick's start ends soon after /health answers
    while "quick" not in {m.id for m in client.models.list().data} and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [m.id for m in client.models.list().data] == ["quick", "all-minilm-l6-v2"]  # lazy: listed
    slow = client.models.retrieve("slow")
    assert slow.status == "loading" and not hasattr(slow, "error")
    assert client.models.retrieve("all-minilm-l6-v2").status == "ready"
    ready = httpx.get(srv.url + "/ready")
    assert ready.status_code == 503 and ready.json()["loading"] == ["slow"]
    assert not any(line.startswith("tokenops serving") for _, line in out.lines), out.text()  # not yet

    broken = client.models.retrieve("broken")  # failed: a card saying so, with the one-line cause
    assert broken.status == "failed" and broken.error == f"RuntimeError: {CAUSE}"
    assert ready.json()["failed"] == {"broken": f"RuntimeError: {CAUSE}"}

    gate.touch()  # slow's load ends
    wait_for(srv.url + "/ready", proc, out)
    assert [m.id for m in client.models.list().data] == ["quick", "slow", "all-minilm-l6-v2"]
    assert client.models.retrieve("slow").status == "ready"
    body = httpx.get(srv.url + "/ready").json()
    assert body["ready"] is True and "loading" not in body and body["failed"] == {"broken": f"RuntimeError: {CAUSE}"}
    with pytest.raises(openai.APIStatusError) as e:  # a request to the failed model names its cause
        client.chat.completions.create(model="broken", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 503 and CAUSE in e.value.message


def test_the_log_says_loading_then_loaded_then_ready_then_serving(serving):
    srv, proc, out, gate = serving
    gate.touch()
    wait_for(srv.url + "/ready", proc, out)
    deadline = time.monotonic() + 30  # the serving line follows /ready closely, from another thread
    while not any(line.startswith("tokenops serving") for _, line in out.lines) and time.monotonic() < deadline:
        time.sleep(0.1)
    starting = out.index("tokenops starting at " + srv.url)
    loading, loaded = out.index("loading slow (gated)"), out.index("loaded slow in ")
    failed = out.index("broken failed after ")
    ready, serving_line = out.index("ready: quick, slow, all-minilm-l6-v2"), out.index("tokenops serving ")
    assert starting < loading < loaded < ready < serving_line, out.text()
    assert out.index("loading broken (gated)") < failed < ready
    assert out.index("all-minilm-l6-v2 (embedding): loads on its first request") < ready
    assert out.lines[serving_line][1].startswith(f"tokenops serving quick, slow, all-minilm-l6-v2 at {srv.base_url}")
    causes = [line for _, line in out.lines if "broken" in line and "failed to load" in line]
    assert len(causes) == 1 and CAUSE in causes[0], out.text()  # the cause once, in the log


def test_serve_with_only_a_failing_model_exits_at_once_naming_it(tmp_path):
    gate = tmp_path / "gate"
    config = serve_config(model("broken", backend="gated", engine={"gate": str(gate), "fail": CAUSE}))
    srv, proc, out = start(tmp_path, config)
    try:
        wait_for(srv.url + "/health", proc, out)
        assert httpx.get(srv.url + "/v1/models").json()["data"] == []  # loading: nothing listed yet
        assert httpx.get(srv.url + "/v1/models/broken").json()["status"] == "loading"
        gate.touch()  # the load ends, failing
        proc.wait(timeout=60)
        exited = time.monotonic()
    finally:
        stop(proc, out)
    assert proc.returncode != 0, out.text()
    failed_at = out.lines[out.index("broken failed after ")][0]
    assert exited - failed_at < 5.0, out.text()
    last = out.lines[-1][1]
    assert last == f"error: nothing to serve: model 'broken' failed to load: RuntimeError: {CAUSE}", out.text()
    assert not any(line.startswith("tokenops serving") for _, line in out.lines), out.text()
    assert "Traceback" not in out.text()


@pytest.mark.slow
def test_the_first_start_says_it_compiles_the_kernels_once(tmp_path):
    """A shipped HF model on the bundled engine with an empty kernel cache: the compile is a step of
    the load, saying where it is cached; the second start finds the kernels there and says nothing."""
    import tokenops

    folder = Path(tokenops.__file__).parent / "demo_models" / "ladder-small"
    cache = tmp_path / "kernels"
    logs = []
    for run in ("first", "second"):
        env = {"TOKENOPS_NATIVE_CACHE": str(cache)}
        with ServeProcess(tmp_path / run, args=["--model", f"small={folder}"], env=env, store=False) as srv:
            client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
            assert [m.id for m in client.models.list().data] == ["small"]
            got = client.chat.completions.create(model="small", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=4)
            assert got.usage.completion_tokens >= 1
        logs.append(srv.log().splitlines())
    first, second = logs

    def at(lines: list[str], prefix: str) -> int:
        found = [i for i, line in enumerate(lines) if line.startswith(prefix)]
        assert found, f"no line starting with {prefix!r} in:\n" + "\n".join(lines)
        return found[0]

    compiling = at(first, "compiling the ")
    assert f"for this CPU (once; cached in {cache})" in first[compiling]
    assert at(first, f"loading small (bundled engine, {folder})") < compiling < at(first, "loaded small in ")
    assert at(first, "loaded small in ") < at(first, "ready: small (") < at(first, "tokenops serving small at ")
    assert not any(line.startswith("compiling ") for line in second), "\n".join(second)
    assert at(second, "loaded small in ") < at(second, "tokenops serving small at ")
