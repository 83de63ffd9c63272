from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tokenops.testing_serve import ServeProcess

FAKE_PLUGIN = str(Path(__file__).resolve().parents[1] / "gateway" / "fake_backend_plugin.py")

#: Two fake models of known price; the fake backend answers "alpha beta gamma delta"
#: (4 completion tokens) and counts prompt words + 3 as prompt tokens.
CONFIG = """
[[models]]
name = "small"
backend = "fake"
cost_input_per_1m = 1000.0
cost_output_per_1m = 2000.0

[[models]]
name = "large"
backend = "fake"
cost_input_per_1m = 5000.0
cost_output_per_1m = 10000.0

[plugins.cascade]
alias = "auto"
models = ["small", "large"]
"""


def serve(workdir, config: str = CONFIG, env: dict | None = None, **kw) -> ServeProcess:
    return ServeProcess(workdir, config=config, env={"TOKENOPS_PLUGINS": FAKE_PLUGIN, "TOKENOPS_BUDGET_TEST_CLOCK": "1",
                                                      **(env or {})}, **kw)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serve(tmp_path_factory.mktemp("keys")) as srv:
        yield srv


@pytest.fixture
def admin(server):
    with httpx.Client(base_url=server.url, headers=server.admin_headers, timeout=10) as client:
        yield client
        client.post("/admin/budget-clock", json={"offset_s": 0})


@pytest.fixture
def redis_url(tmp_path):
    """A real redis-server on a free port (``make redis`` installs it)."""
    from tokenops.testing_serve import RedisUnavailable, redis_server

    try:
        with redis_server(tmp_path) as url:
            yield url
    except RedisUnavailable as e:
        pytest.skip(str(e))
