"""Fixtures of the store tests."""

from __future__ import annotations

import pytest

from tokenops.store import Store


@pytest.fixture
def store(tmp_path):
    """A fresh read-write store in a temporary folder."""
    s = Store.open(tmp_path / "store" / "t.duckdb")
    try:
        yield s
    finally:
        s.close()


def pytest_unconfigure(config):
    """Collect DuckDB objects caught in reference cycles (tracebacks of expected
    errors) before interpreter shutdown, where nanobind would report them as leaks."""
    import gc

    gc.collect()
