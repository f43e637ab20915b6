"""The edge through ``reverie run``: a real Mosquitto given by REVERIE_MQTT__HOST /
REVERIE_MQTT__PORT, real payloads from a second client, and ``reverie status``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.mosquitto import Broker, Client
from tests.reverie_process import reverie as run_cli
from tests.reverie_process import start_runtime
from tests.reverie_process import status as status_json
from tests.waiting import wait_for

NS = "test-edge"
ROOT = Path(__file__).resolve().parent.parent


def reverie(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(env, *args, cwd=ROOT)


def status(env: dict[str, str]) -> dict[str, Any]:
    return status_json(env, cwd=ROOT)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    b = Broker(tmp_path_factory.mktemp("edge-broker")).start()
    yield b
    b.remove()


@pytest.fixture(scope="module")
def running(ray_instance: str, tmp_path_factory: pytest.TempPathFactory, model_cache: Path,
            broker: Broker) -> Iterator[dict[str, str]]:
    data = tmp_path_factory.mktemp("edge-data")
    (data / "reverie.toml").write_text("# the packaged defaults; the broker from the env\n")
    env = {**os.environ, "REVERIE_DATA_DIR": str(data),
           "REVERIE_CONFIG": str(data / "reverie.toml"),
           "REVERIE_RUNTIME__NAMESPACE": NS, "REVERIE_EMBEDDER__CACHE_DIR": str(model_cache),
           "REVERIE_PERSONA__GLOBAL_DIR": str(data / "persona"),
           "REVERIE_MQTT__HOST": "127.0.0.1", "REVERIE_MQTT__PORT": str(broker.port),
           "REVERIE_JOBS__IDLE_AFTER_S": "3600"}
    proc = start_runtime(env, "--address", ray_instance, cwd=ROOT)
    yield env
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0


def test_status_shows_the_bridge_fixes_and_presence(running: dict[str, str],
                                                    broker: Broker) -> None:
    assert wait_for(lambda: status(running)["mqtt"]["subscribed"] is True, 60)
    sensor = Client(broker.port)
    try:
        now = time.time()
        for i, (lat, lon) in enumerate([(38.7223, -9.1393), (38.7301, -9.1502)]):
            sensor.publish("owntracks/alice/phone", json.dumps(
                {"_type": "location", "lat": lat, "lon": lon, "tst": int(now) - 60 + i,
                 "acc": 10}))
        sensor.publish("zigbee2mqtt/kitchen_motion", json.dumps({"occupancy": True}))
        sensor.publish("owntracks/alice/phone", b"{broken")
        sensor.publish("zigbee2mqtt/kitchen_motion", json.dumps({"occupancy": "yes"}))

        def settled() -> bool:
            s = status(running)
            mqtt, loc = s["mqtt"], s["location"]
            assert isinstance(mqtt, dict) and isinstance(loc, dict)
            return (mqtt["accepted"] >= 3 and sum(mqtt["rejected"].values()) >= 2
                    and loc["fixes"] >= 2 and "household" in (s["presence"] or {}))

        assert wait_for(settled, 60), status(running)
        s = status(running)
        assert s["mqtt"]["rejected"] == {"malformed-json": 1, "wrong-type": 1}
        assert s["location"]["last_fix_at"] == int(now) - 59
        household = s["presence"]["household"]
        assert household["state"] == "home" and household["place"] == "kitchen_motion"
        # the occupancy was activity at home: the idle gate is closed
        idle = json.loads(reverie(running, "jobs", "--json").stdout)["idle"]
        assert idle["idle"] is False and idle["reason"] == "active"
        words = reverie(running, "status")
        assert words.returncode == 0, words.stderr
        assert "mqtt: connected to 127.0.0.1:" in words.stdout
        assert "location: 2 fixes" in words.stdout
        assert "household" in words.stdout and "kitchen_motion" in words.stdout
        # the bridge is still there
        assert status(running)["mqtt"]["connected"] is True
    finally:
        sensor.close()


def test_without_a_broker_the_runtime_says_so(tmp_path: Path) -> None:
    """No runtime needed: the status wording for an unconfigured bridge."""
    from actors.cli.lifecycle import _edge_lines
    from actors.messages import EdgeInfo, LocationInfo, Status
    from runtime.config import load_settings

    s = Status(namespace="x", actors={}, counts={},
               mqtt=EdgeInfo(configured=False, connected=False),
               location=LocationInfo(fixes=0, last_fix_at=None), presence={})
    lines = list(_edge_lines(s, load_settings(env={})))
    assert lines[0].startswith("mqtt: no broker configured")
    assert lines[1] == "location: 0 fixes, last never"


def test_the_gps_reader_stores_fixes_and_publishes_them(
        ray_instance: str, tmp_path: Path, model_cache: Path, broker: Broker) -> None:
    """gpsd (through gpsfake, replaying a drive) -> the edge's GPS reader -> the location
    history, and out on ``reverie/gps/<person>`` through the bridge."""
    import shutil
    import tempfile

    from tests.test_gps import DATA, Gpsfake, _free_port

    work = Path(tempfile.mkdtemp(prefix="gpsfake-"))  # short: gpsfake's socket path
    fake = Gpsfake(work)
    port = _free_port()
    watcher = Client(broker.port)
    watcher.subscribe("reverie/gps/#")
    (tmp_path / "reverie.toml").write_text("")
    env = {**os.environ, "REVERIE_DATA_DIR": str(tmp_path / "data"),
           "REVERIE_CONFIG": str(tmp_path / "reverie.toml"),
           "REVERIE_RUNTIME__NAMESPACE": "test-gps",
           "REVERIE_EMBEDDER__CACHE_DIR": str(model_cache),
           "REVERIE_PERSONA__GLOBAL_DIR": str(tmp_path / "persona"),
           "REVERIE_MQTT__HOST": "127.0.0.1", "REVERIE_MQTT__PORT": str(broker.port),
           "REVERIE_MQTT__CLIENT_ID": "reverie-gps-test",
           "REVERIE_GPS__ENABLED": "true", "REVERIE_GPS__PORT": str(port),
           "REVERIE_GPS__POLL_S": "0.2"}
    proc = start_runtime(env, "--address", ray_instance, cwd=ROOT)
    try:
        # the drive replays again and again (the reader retries until the runtime
        # is up), 0.9 s an epoch: the reader samples gpsd's current fix every
        # 0.2 s from an actor that a busy machine may starve for seconds (it once
        # saw fewer than 3 of a single replay's 15 fixes beside a CPU hog, and
        # again on a machine three times slower); each replay is another chance
        fake.start(DATA / "drive.nmea", port, cycle_s=0.3, once=False)
        assert wait_for(lambda: status(env)["location"]["fixes"] >= 3, 60), \
            status(env)
        assert status(env)["actors"]["edge"] == "ok"
        assert wait_for(lambda: len(watcher.messages("reverie/gps/hub")) >= 1, 30)
        published = json.loads(watcher.messages("reverie/gps/hub")[0].payload)
        assert published["source"] == "gpsd" and published["person"] == "hub"
        assert -90 <= published["lat"] <= 90
    finally:
        watcher.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        fake.stop()
        shutil.rmtree(work, ignore_errors=True)
