"""The GPS reader against a real gpsd (3.22) fed by ``gpsfake``, plus a scripted
gpsd stand-in for what a real receiver never sends (bad coordinates, garbage).

The NMEA logs in ``tests/data/gps/`` are read here too, independently of gpsd:
each fix the reader returns must be one of the log's fixes, at the log's time
and position. gpsfake starts feeding its log as soon as the device is added,
while gpsd is still probing it, so the first epoch or two may never reach
gpsd; the tests ask for most of the fixes, not all.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import operator
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from device.gps import GpsReader
from device.records import LocationRecord
from runtime.config import GpsSettings
from tests.waiting import wait_for

DATA = Path(__file__).parent / "data" / "gps"
DRIVE = DATA / "drive.nmea"
DRIVE_2D = DATA / "drive_2d.nmea"
NO_DATE_FIRST = DATA / "no_date_first.nmea"
CYCLE_S = 0.1       # gpsfake's delay between sentences: an epoch (RMC, GGA, GSA) lasts 0.3 s
POLL_S = 0.05       # the tests read faster than an epoch, to see each fix

# gpsd-py3 logs "No gps devices found" with the deprecated Logger.warn when gpsd
# has no receiver yet (gpsfake adds its device just after gpsd starts).
pytestmark = pytest.mark.filterwarnings(
    "ignore:The 'warn' method is deprecated:DeprecationWarning")


# -- the logs, read without gpsd ----------------------------------------------

@dataclass(frozen=True)
class LogEpoch:
    at: float
    fix: bool
    lat: float | None = None
    lon: float | None = None


def _degrees(value: str, hemisphere: str) -> float:
    head, minutes = divmod(float(value), 100.0)
    degrees = head + minutes / 60.0
    return -degrees if hemisphere in ("S", "W") else degrees


def read_log(path: Path) -> list[LogEpoch]:
    """One entry per RMC sentence, checking every sentence's checksum."""
    epochs = []
    for line in path.read_text().splitlines():
        if not line.startswith("$"):
            continue
        body, checksum = line[1:].split("*")
        assert int(checksum, 16) == functools.reduce(operator.xor, body.encode(), 0), line
        fields = body.split(",")
        if fields[0] != "GPRMC":
            continue
        hhmmss, status, date = fields[1], fields[2], fields[9]
        at = datetime.strptime(date + hhmmss, "%d%m%y%H%M%S.%f").replace(tzinfo=UTC).timestamp()
        if status == "A":
            epochs.append(LogEpoch(at, True, _degrees(fields[3], fields[4]),
                                   _degrees(fields[5], fields[6])))
        else:
            epochs.append(LogEpoch(at, False))
    return epochs


def test_the_logs_are_a_drive_with_gaps() -> None:
    drive = read_log(DRIVE)
    fixes = [e for e in drive if e.fix]
    assert [e.fix for e in drive[:3]] == [False] * 3
    assert any(not e.fix for e in drive[3:])                      # the tunnel
    assert len(fixes) == 9
    assert len({e.at for e in drive}) == len(drive)
    assert len({(e.lat, e.lon) for e in fixes}) == len(fixes)
    assert len([e for e in read_log(DRIVE_2D) if e.fix]) == 5
    assert "GPGSA,A,3" not in DRIVE_2D.read_text()
    assert len(read_log(NO_DATE_FIRST)) == 4
    assert NO_DATE_FIRST.read_text().count("$GPGGA") == 14


# -- gpsfake --------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _listening(port: int) -> list[str]:
    """Local addresses (hex, as in /proc/net/tcp{,6}) listening on ``port``."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            address, hex_port = fields[1].rsplit(":", 1)
            if int(hex_port, 16) == port and fields[3] == "0A":        # TCP_LISTEN
                found.append(address)
    return found


def _loopback(address: str) -> bool:
    if len(address) == 8:                                           # IPv4, little-endian
        return address.endswith("7F")                               # 127.0.0.0/8
    return address in ("00000000000000000000000001000000",          # ::1
                       "0000000000000000FFFF00000100007F")          # ::ffff:127.0.0.1


class Gpsfake:
    """One ``gpsfake`` (and the gpsd it starts) in its own process group."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0

    def start(self, log: Path, port: int, cycle_s: float = CYCLE_S, once: bool = True) -> None:
        """Replay ``log`` once (``once``, else again and again), ``cycle_s``
        between sentences."""
        self.started += 1
        output = (self.workdir / f"gpsfake-{self.started}.out").open("wb")
        command = ["gpsfake", "-q", *(["-1"] if once else []), "-c", str(cycle_s),
                   "-P", str(port), str(log)]
        self.proc = subprocess.Popen(
            command, cwd=self.workdir, stdin=subprocess.DEVNULL, stdout=output,
            stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "TMPDIR": str(self.workdir)})       # its control socket
        output.close()
        proc = self.proc
        assert wait_for(lambda: proc.poll() is not None or bool(_listening(port)), 60), \
            "gpsd never listened"
        assert proc.poll() is None, f"gpsfake exited: {self.output()}"
        addresses = _listening(port)
        assert addresses and all(_loopback(a) for a in addresses), addresses

    def stop(self) -> None:
        """Kill gpsfake and gpsd (SIGTERM, then SIGKILL: gpsfake does not always
        exit on SIGTERM once its log is used up)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=1)
                break
            except subprocess.TimeoutExpired:
                continue
        proc.wait(timeout=5)
        try:
            os.killpg(proc.pid, signal.SIGKILL)                     # gpsd, if it outlived it
        except ProcessLookupError:
            pass

    def output(self) -> str:
        return "".join(p.read_text(errors="replace")
                       for p in sorted(self.workdir.glob("gpsfake-*.out")))


@pytest.fixture
def gpsfake() -> Iterator[Gpsfake]:
    workdir = Path(tempfile.mkdtemp(prefix="gpsfake-"))            # short: a socket path
    fake = Gpsfake(workdir)
    try:
        yield fake
    finally:
        fake.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def readers() -> Iterator[list[GpsReader]]:
    """Readers to close after the test (gpsd-py3 has one connection per process)."""
    made: list[GpsReader] = []
    yield made
    for reader in made:
        reader.close()


@dataclass
class Seen:
    records: list[LocationRecord]
    reports: list[tuple[int, float | None]]     # (mode, time) of each report read


def read_until(reader: GpsReader, seen: Seen, done: Callable[[], bool],
               timeout: float = 60.0) -> bool:
    """Call ``reader.read()`` every 50 ms until ``done()``; False on timeout (only a
    broken run). A steady 50 ms, not ``wait_for``'s growing pause: each call
    samples gpsd's current fix, and the replay moves on whether or not it is
    asked, so a slower cadence would miss fixes the tests count."""
    deadline = time.monotonic() + timeout
    while True:
        record = reader.read()
        if record is not None:
            seen.records.append(record)
        if reader.connected:
            seen.reports.append((reader.last_mode, reader.last_time))
        if done():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _settings(port: int, **more: Any) -> GpsSettings:
    return GpsSettings(enabled=True, port=port, poll_s=POLL_S, person="hub", **more)


def check_against_log(records: list[LocationRecord], log: list[LogEpoch],
                      one_replay: bool = True) -> None:
    """Each record is a fix of the log, as logged; from ``one_replay``, each
    once and in order (a log replayed again and again starts over)."""
    fixes = {e.at: e for e in log if e.fix}
    times = [r.at for r in records]
    if one_replay:
        assert len(times) == len(set(times)), "a fix returned twice"
        assert times == sorted(times)
    for record in records:
        assert record.at in fixes, f"no fix in the log at {record.at}"
        assert record.lat == pytest.approx(fixes[record.at].lat, abs=1e-5)
        assert record.lon == pytest.approx(fixes[record.at].lon, abs=1e-5)
        assert (record.person, record.source, record.device) == ("hub", "gpsd", "gpsd")
        assert record.accuracy_m is None or (math.isfinite(record.accuracy_m)
                                             and record.accuracy_m > 0)


# -- against gpsd ----------------------------------------------------------------

def test_each_fix_of_the_drive_once_and_none_without_a_fix(
        gpsfake: Gpsfake, readers: list[GpsReader], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    log = read_log(DRIVE)
    fixes = [e for e in log if e.fix]
    no_fix = {e.at for e in log if not e.fix}
    port = _free_port()
    gpsfake.start(DRIVE, port)
    reader = GpsReader(_settings(port))
    readers.append(reader)
    assert reader.connect()
    seen = Seen([], [])

    # Until the last fix has come and gone (gpsd drops to mode 0 about a second
    # after its input ends): the last fix is polled many times meanwhile.
    assert read_until(reader, seen, lambda: any(r.at == fixes[-1].at for r in seen.records))
    assert read_until(reader, seen, lambda: reader.last_mode == 0)

    check_against_log(seen.records, log)
    times = [r.at for r in seen.records]
    assert len(times) >= 6, gpsfake.output()
    assert times[0] < min(no_fix - {e.at for e in log[:3]}) < times[-1]   # both sides of the tunnel
    assert any(r.accuracy_m is not None for r in seen.records)
    # gpsd did report the epochs without a fix (mode 1, at the tunnel's times)...
    assert {t for mode, t in seen.reports if mode == 1} & no_fix
    # ... and the reader returned none of them.
    assert not set(times) & no_fix
    assert (reader.errors, reader.rejected, reader.fixes) == (0, 0, len(times))
    assert reader.connected

    logged = "\n".join(r.getMessage() for r in caplog.records)
    for fix in fixes:
        assert f"{fix.lat:.3f}" not in logged and f"{fix.lon:.3f}" not in logged


def test_gpsd_going_away_and_coming_back(gpsfake: Gpsfake, readers: list[GpsReader]) -> None:
    # The drive is replayed again and again: on a loaded machine a single
    # replay (about 5 s) was seen to end before the reader had two fixes of it.
    port = _free_port()
    gpsfake.start(DRIVE, port, once=False)
    reader = GpsReader(_settings(port), timeout_s=3.0, backoff_min_s=0.2, backoff_max_s=0.4)
    readers.append(reader)
    seen = Seen([], [])
    assert read_until(reader, seen, lambda: len(seen.records) >= 2)     # read() connects

    gpsfake.stop()
    results = [reader.read() for _ in range(3)]
    assert results == [None, None, None]
    assert not reader.connected
    errors = reader.errors
    assert errors >= 1
    time.sleep(0.5)                                                     # past the back-off
    assert reader.read() is None and not reader.connected
    assert reader.errors > errors                                       # tried, and failed

    before = len(seen.records)
    gpsfake.start(DRIVE, port, once=False)
    assert read_until(reader, seen, lambda: len(seen.records) >= before + 2), gpsfake.output()
    assert reader.connected
    check_against_log(seen.records[:before], read_log(DRIVE), one_replay=False)
    check_against_log(seen.records[before:], read_log(DRIVE), one_replay=False)


@pytest.mark.parametrize("min_mode", [2, 3])
def test_min_mode_with_only_2d_fixes(min_mode: int, gpsfake: Gpsfake,
                                     readers: list[GpsReader]) -> None:
    log = read_log(DRIVE_2D)
    last = [e for e in log if e.fix][-1]
    port = _free_port()
    gpsfake.start(DRIVE_2D, port)
    reader = GpsReader(_settings(port, min_mode=min_mode))
    readers.append(reader)
    seen = Seen([], [])
    # gpsd has reported the log's last fix, as 2D (whatever the reader made of it).
    assert read_until(reader, seen, lambda: (reader.last_mode, reader.last_time)
                      == (2, last.at)), gpsfake.output()
    assert {mode for mode, _ in seen.reports} <= {0, 1, 2}
    if min_mode == 2:
        assert len(seen.records) >= 3
        check_against_log(seen.records, log)
    else:
        assert seen.records == []


def test_a_3d_fix_without_a_time_is_not_a_fix_yet(gpsfake: Gpsfake,
                                                  readers: list[GpsReader]) -> None:
    """GGA before any RMC: gpsd knows the position but not the date."""
    log = read_log(NO_DATE_FIRST)
    port = _free_port()
    gpsfake.start(NO_DATE_FIRST, port)
    reader = GpsReader(_settings(port))
    readers.append(reader)
    seen = Seen([], [])
    assert read_until(reader, seen, lambda: any(r.at == log[-1].at for r in seen.records)), \
        gpsfake.output()
    assert (3, None) in seen.reports, "gpsd gave no timeless fix: the log is too short?"
    check_against_log(seen.records, log)
    assert len(seen.records) >= 3
    assert (reader.rejected, reader.errors) == (0, 0)


# -- against a scripted stand-in -------------------------------------------------

def tpv(**fields: Any) -> dict[str, Any]:
    return {"class": "TPV", "device": "/dev/fake", **fields}


def poll(*tpvs: dict[str, Any], active: int = 1) -> str:
    return json.dumps({"class": "POLL", "time": "2024-05-01T10:00:00.000Z",
                       "active": active, "tpv": list(tpvs), "sky": []})


class ScriptedGpsd:
    """Speaks enough of gpsd's protocol for gpsd-py3 and the reader: answers each
    ``?POLL;`` with the next line of the script (the last one over and over)."""

    def __init__(self, script: list[str]) -> None:
        self.script = list(script)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.port = int(self.server.getsockname()[1])
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            with conn, conn.makefile("rw") as stream:
                stream.write('{"class":"VERSION","release":"3.22","proto_major":3}\n')
                stream.flush()
                for line in stream:
                    if line.startswith("?WATCH"):
                        stream.write('{"class":"DEVICES","devices":[{"path":"/dev/fake"}]}\n'
                                     '{"class":"WATCH","enable":true}\n')
                    elif line.startswith("?POLL"):
                        answer = self.script.pop(0) if len(self.script) > 1 else self.script[0]
                        if answer == "<hang up>":
                            break
                        stream.write(answer + "\n")
                    stream.flush()

    def close(self) -> None:
        self._stop.set()
        self.server.close()
        self._thread.join(timeout=5)


@pytest.fixture
def scripted() -> Iterator[Callable[[list[str]], ScriptedGpsd]]:
    made: list[ScriptedGpsd] = []

    def make(script: list[str]) -> ScriptedGpsd:
        made.append(ScriptedGpsd(script))
        return made[-1]
    yield make
    for server in made:
        server.close()


T0 = "2024-05-01T10:00:0{}.000Z"
AT0 = datetime(2024, 5, 1, 10, 0, tzinfo=UTC).timestamp()


def test_bad_fixes_are_counted_not_raised(scripted: Callable[[list[str]], ScriptedGpsd],
                                          readers: list[GpsReader]) -> None:
    server = scripted([
        poll(active=0),                                             # no receiver
        poll(tpv(mode=1, time=T0.format(1), lat=48.1, lon=11.5)),   # no fix (a stale position)
        poll(tpv(mode=3, time=T0.format(2), lat=91.5, lon=11.5, eph=9.0)),
        poll(tpv(mode=3, time=T0.format(2), lat=91.5, lon=11.5, eph=9.0)),   # counted once
        poll(tpv(mode=3, time=T0.format(3), lat=48.1, lon=11.5, eph=-1.0)),
        poll(tpv(mode=3, time=T0.format(4), lon=11.5)),             # no latitude yet,
        poll(tpv(mode=3, lat=48.1, lon=11.5)),                      # no time yet: not counted
        poll(tpv(mode=3, time=T0.format(4), lat="48.1", lon=11.5)),
        poll(tpv(mode=3, time="yesterday", lat=48.1, lon=11.5)),
        poll(tpv(mode=2, time=T0.format(5), lat=48.1, lon=11.5, epx=3.0, epy=4.5)),
        poll(tpv(mode=2, time=T0.format(5), lat=48.1, lon=11.5, epx=3.0, epy=4.5)),  # same time
        poll(tpv(mode=3, time=T0.format(6), lat=-33.9, lon=151.2)),
    ])
    reader = GpsReader(_settings(server.port))
    readers.append(reader)
    assert reader.connect()
    results = [reader.read() for _ in range(12)]
    assert results[:9] == [None] * 9
    assert results[9] == LocationRecord(person="hub", lat=48.1, lon=11.5, at=AT0 + 5,
                                        source="gpsd", accuracy_m=4.5, device="gpsd")
    assert results[10] is None
    assert results[11] == LocationRecord(person="hub", lat=-33.9, lon=151.2, at=AT0 + 6,
                                         source="gpsd", accuracy_m=None, device="gpsd")
    assert reader.rejected == 4
    assert reader.rejected_by_reason == {"bad-coordinates": 2, "wrong-type": 1,
                                         "bad-timestamp": 1}
    assert (reader.errors, reader.fixes, reader.connected) == (0, 2, True)


def test_garbage_and_hang_ups_reconnect(scripted: Callable[[list[str]], ScriptedGpsd],
                                        readers: list[GpsReader]) -> None:
    fix = poll(tpv(mode=3, time=T0.format(7), lat=48.1, lon=11.5, eph=5.0))
    server = scripted(["this is not json", "<hang up>", fix])
    reader = GpsReader(_settings(server.port), backoff_min_s=0.05)
    readers.append(reader)
    assert reader.read() is None and not reader.connected          # garbage: dropped
    assert reader.read() is None and not reader.connected          # hung up on
    record = reader.read()
    assert record is not None and record.at == AT0 + 7 and record.accuracy_m == 5.0
    assert (reader.errors, server.connections, reader.connected) == (2, 3, True)


def test_one_connected_reader_per_process(scripted: Callable[[list[str]], ScriptedGpsd],
                                          readers: list[GpsReader]) -> None:
    server = scripted([poll(tpv(mode=3, time=T0.format(8), lat=48.1, lon=11.5))])
    first, second = GpsReader(_settings(server.port)), GpsReader(_settings(server.port))
    readers.extend([first, second])
    assert first.connect()
    with pytest.raises(RuntimeError, match="one connection per process"):
        second.connect()
    assert second.read() is None and second.errors == 1            # counted, not raised
    assert first.read() is not None
    first.close()
    assert not first.connected
    assert second.connect()
    assert second.read() is not None


def test_no_gpsd_is_an_error_with_back_off(readers: list[GpsReader]) -> None:
    port = _free_port()                                             # nothing listens there
    reader = GpsReader(_settings(port), backoff_min_s=30.0)
    readers.append(reader)
    assert not reader.connect()
    assert [reader.read() for _ in range(5)] == [None] * 5
    assert reader.errors == 1                                       # waiting out the back-off


def test_run_goes_on_after_emit_fails(scripted: Callable[[list[str]], ScriptedGpsd],
                                      readers: list[GpsReader],
                                      caplog: pytest.LogCaptureFixture) -> None:
    server = scripted([poll(tpv(mode=3, time=T0.format(n), lat=48.1 + n / 1000, lon=11.5))
                       for n in range(1, 5)])
    reader = GpsReader(_settings(server.port))
    readers.append(reader)
    got: list[LocationRecord] = []

    def emit(record: LocationRecord) -> None:
        got.append(record)
        if len(got) == 1:
            raise ValueError(f"cannot store {record.lat}")

    stop = threading.Event()
    thread = threading.Thread(target=reader.run, args=(stop, emit))
    thread.start()
    try:
        assert wait_for(lambda: len(got) >= 3, 60)
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive()
    assert [r.at for r in got[:3]] == [AT0 + 1, AT0 + 2, AT0 + 3]
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors and "ValueError" in errors[0] and "48.1" not in errors[0]
