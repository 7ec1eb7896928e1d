"""Integration tests talk to the real PostgreSQL and Mosquitto on this machine.

If one is unreachable the tests fail (never skip) with the command that starts it.
"""

from __future__ import annotations

import os
import socket

import pytest

PG_HOST, PG_PORT = "127.0.0.1", 5432
MQTT_HOST, MQTT_PORT = "127.0.0.1", 1883
PG_URL = os.environ.get("SKYFED_TEST_PG_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")

_HOW = {
    "PostgreSQL": "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start",
    "Mosquitto": "mosquitto -d -c /etc/mosquitto/mosquitto.conf",
}


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def require_service(name: str, host: str, port: int) -> None:
    if not _reachable(host, port):
        pytest.fail(f"{name} is not reachable on {host}:{port}; start it with: {_HOW[name]}",
                    pytrace=False)


@pytest.fixture(scope="session")
def pg_url() -> str:
    require_service("PostgreSQL", PG_HOST, PG_PORT)
    return PG_URL


@pytest.fixture(scope="session")
def mqtt_addr() -> tuple[str, int]:
    require_service("Mosquitto", MQTT_HOST, MQTT_PORT)
    return MQTT_HOST, MQTT_PORT
