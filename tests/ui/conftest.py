"""Fixtures for the dashboard tests: a private Mosquitto per test (tests/conftest.py), the live helpers on the path."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "live"))

DEVICES = ["A", "B"]


@pytest.fixture
def fleet_devices():
    """The devices the broker's ACL admits (tests/conftest.py ``broker``)."""
    return DEVICES
