"""Fixtures shared by the live and dashboard tests: a private Mosquitto per test for the folder's ``fleet_devices``."""
import pytest


@pytest.fixture
def mosquitto():
    """Skip the test when this machine has no Mosquitto (scripts/setup.sh installs it)."""
    from backend.live.broker import BrokerError, find_mosquitto
    try:
        find_mosquitto()
    except BrokerError as e:
        pytest.skip(str(e))


@pytest.fixture
def broker(mosquitto, tmp_path, fleet_devices):
    """A Mosquitto on a free loopback port with an ACL for fleet ``t`` and the folder's devices."""
    from backend.live.broker import Broker
    with Broker(tmp_path / "broker", "t", fleet_devices) as b:
        yield b
