"""Fixtures for the live tests: a private Mosquitto per test, precompiled MicroPython agent per session."""
import pytest

from backend.live.broker import Broker, BrokerError, find_mosquitto
from helpers import precompile

FLEET = "t"
DEVICES = ["A", "B", "C", "M"]


@pytest.fixture
def mosquitto():
    """Skip the test when this machine has no Mosquitto (scripts/setup.sh installs it)."""
    try:
        find_mosquitto()
    except BrokerError as e:
        pytest.skip(str(e))


@pytest.fixture
def broker(mosquitto, tmp_path):
    with Broker(tmp_path / "broker", FLEET, DEVICES) as b:
        yield b


@pytest.fixture(scope="session")
def mpy(tmp_path_factory):
    return precompile(str(tmp_path_factory.mktemp("mpy")))
