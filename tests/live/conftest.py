"""Fixtures for the live tests: a private Mosquitto per test (tests/conftest.py), the precompiled MicroPython agent."""
import pytest

from helpers import precompile

DEVICES = ["A", "B", "C", "M"]


@pytest.fixture
def fleet_devices():
    """The devices the broker's ACL admits (tests/conftest.py ``broker``)."""
    return DEVICES


@pytest.fixture(scope="session")
def mpy(tmp_path_factory):
    return precompile(str(tmp_path_factory.mktemp("mpy")))
