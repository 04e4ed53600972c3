"""Fixtures for the dashboard tests: a private Mosquitto per test (as tests/live), the live helpers on the path."""
import os
import sys

import pytest

from backend.live.broker import Broker, BrokerError, find_mosquitto

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "live"))

FLEET = "t"
DEVICES = ["A", "B"]


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
