"""pytest fixtures for tokenops plugin authors.

Installed as a pytest plugin through the ``pytest11`` entry point, so a project
that has tokenops installed gets these fixtures without any ``conftest.py``
(do not also list ``tokenops.testing`` in ``pytest_plugins``: it would be
registered twice).

This module is imported by every pytest run in an environment with tokenops,
so it imports only pytest at module level; fixtures import what they need.

Fixtures:

- ``tokenops_store`` — a fresh :class:`tokenops.store.Store` in a temporary
  directory with its telemetry writer started (flush interval 0.05 s) and
  attached to the DuckDB sink, so ``tokenops_record`` events land in it; call
  ``tokenops_store.writer().flush()`` before reading. Closed afterwards.
- ``register_plugin`` — a function ``register_plugin(obj, name=None) -> name``
  that registers a plugin object with the plugin manager; every plugin it
  registered is unregistered at teardown, even when the test fails.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

# ---------------------------------------------------------------------------
# store fixtures (owned by the store; keep other fixtures in their own sections)
# ---------------------------------------------------------------------------


@pytest.fixture
def tokenops_store(tmp_path: Any) -> Iterator[Any]:
    """A temporary store with a started writer attached to the DuckDB sink."""
    from tokenops.store import Store, sink

    store = Store.open(tmp_path / "tokenops-test.duckdb")
    writer = store.writer(flush_interval_s=0.05)
    previous = sink.attach(writer)
    try:
        yield store
    finally:
        sink.detach()
        if previous is not None:
            sink.attach(previous)
        store.close()


# ---------------------------------------------------------------------------
# plugin fixtures
# ---------------------------------------------------------------------------


@pytest.fixture
def register_plugin() -> Iterator[Callable[..., str]]:
    """Register plugin objects for one test; they are unregistered at teardown."""
    from tokenops import plugin_manager as plugins

    names: list[str] = []

    def register(plugin: Any, name: str | None = None) -> str:
        registered = plugins.register_plugin(plugin, name=name)
        names.append(registered)
        return registered

    try:
        yield register
    finally:
        for name in reversed(names):
            plugins.unregister_plugin(name)


# ---------------------------------------------------------------------------
# gateway fixtures (owned by the gateway; see tokenops/testing_gateway.py)
# ---------------------------------------------------------------------------


@pytest.fixture
def fake_backend() -> Any:
    """A fresh :class:`tokenops.testing_gateway.FakeBackend` serving ``fake-model``."""
    from tokenops.testing_gateway import FakeBackend

    return FakeBackend()


@pytest.fixture
async def gateway(fake_backend: Any) -> Any:
    """An ``httpx.AsyncClient`` on a started gateway whose only backend is ``fake_backend``
    (needs pytest-asyncio); ``gateway.gateway`` is the server state, admin key ``test-admin-key``."""
    from tokenops.testing_gateway import gateway_client

    async with gateway_client([fake_backend]) as client:
        yield client


def __getattr__(name: str) -> Any:  # FakeBackend / gateway_client without importing the gateway eagerly
    if name in ("FakeBackend", "gateway_client"):
        from tokenops import testing_gateway

        return getattr(testing_gateway, name)
    raise AttributeError(name)
