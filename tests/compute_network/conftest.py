import pytest

from .helpers import FakeClock


@pytest.fixture
def clock():
    return FakeClock()
