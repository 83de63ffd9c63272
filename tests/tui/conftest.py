"""Dashboard test setup: helpers in this folder import by name; the fake admin client fixture."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fake_admin import FakeAdminClient  # noqa: E402


@pytest.fixture
def fake_client() -> FakeAdminClient:
    return FakeAdminClient()
