"""The Wyoming handle service (``actors/http/wyoming.py``, in the HTTP actor),
driven with the ``wyoming`` package's ``AsyncTcpClient`` as Home Assistant's
wyoming conversation agent drives it (``transcript`` with a ``context`` holding
``conversation_id``, ``device_id`` and ``satellite_id``; ``handled`` or
``not-handled`` back), against the runtime on the test session's Ray with a
local server speaking the OpenAI API as the model.

The allow list is tested on a real socket outside loopback: an HTTP actor built
in this process serves Wyoming on this machine's first non-loopback IPv4
address, and a client connecting from that address is refused when it is not
on the list (skipped on a machine with no such address). There too, the zeroconf
announcement is browsed and resolved with the ``zeroconf`` package (as Home
Assistant's discovery does), and seen withdrawn when the service stops."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import socket
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from fake_openai import FakeOpenAI, Mode
from wyoming.asr import Transcript
from wyoming.client import AsyncTcpClient
from wyoming.event import Event
from wyoming.handle import Handled, NotHandled
from wyoming.info import Describe, Info

from actors.handles import HttpClient, TranscriptClient
from actors.http.backend import ActorBackend
from actors.http.server import HttpActor
from actors.messages import RecentTurns
from runtime.config import Settings, load_settings
from runtime.memories.transcript import MAX_TURN_CHARS
from tests.http_runtime import Api, http_runtime
from tests.reverie_process import joined_runtime, runtime_env, status

NS = "test-wyoming"
CODE = "4471"
CLIENT_TIMEOUT_S = 120.0
SATELLITES = {
    "satellite-kitchen": {"room": "kitchen", "person": "Bob"},
    "device-bedroom": {"room": "bedroom", "person": "Ana"},
}


def runtime_sections(server: FakeOpenAI, **wyoming: Any) -> dict[str, Any]:
    return {
        "household": {"people": ["Ana", "Bob"]},
        "llm": {"providers": [{"name": "local", "base_url": server.base_url,
                               "model": "tiny", "timeout_s": 30}]},
        "wyoming": {"enabled": True, "port": 0, "satellites": SATELLITES, **wyoming},
    }


@pytest.fixture(scope="module")
def running(ray_instance: str, server: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory,
            model_cache: Path) -> Iterator[Api]:
    data = tmp_path_factory.mktemp("wyoming-data")
    with http_runtime(NS, data, model_cache, **runtime_sections(server)) as api:
        yield api


@pytest.fixture(scope="module")
def address(running: Api) -> tuple[str, int]:
    wy = HttpClient(NS).call("wyoming_address", reply=str, timeout=30)
    parts = urlsplit(wy)
    assert parts.scheme == "tcp" and parts.hostname == "127.0.0.1", wy
    assert parts.port is not None
    return parts.hostname, parts.port


async def _exchange(host: str, port: int, event: Event | None) -> Event | None:
    async with AsyncTcpClient(host, port) as client:
        if event is not None:
            await client.write_event(event)
        return await client.read_event()


def exchange(where: tuple[str, int], event: Event | None) -> Event | None:
    """Send ``event`` (or nothing) on a new connection; the first event back, or
    None when the service closed the connection."""
    return asyncio.run(asyncio.wait_for(_exchange(*where, event), CLIENT_TIMEOUT_S))


def transcript(text: str, **context: str) -> Event:
    """A transcript as Home Assistant's wyoming conversation agent sends it."""
    return Transcript(text, context={"conversation_id": "01JTEST", **context},
                      language="en").event()


def test_describe_answers_info_with_one_handle_program(address: tuple[str, int]) -> None:
    answer = exchange(address, Describe().event())
    assert answer is not None and Info.is_type(answer.type)
    info = Info.from_event(answer)
    [program] = info.handle
    assert program.name == "reverie" and program.installed
    assert program.description and program.version
    assert program.attribution.name == "Reverie"
    [model] = program.models
    assert model.installed and model.languages == ["en"]
    assert not info.asr and not info.tts and not info.intent


def test_a_transcript_is_a_voice_turn_handled_with_the_reply(
        address: tuple[str, int], server: FakeOpenAI) -> None:
    server.mode = Mode.OK
    answer = exchange(address, transcript("Is the oven off?", satellite_id="satellite-kitchen"))
    assert answer is not None and Handled.is_type(answer.type), answer
    handled = Handled.from_event(answer)
    assert handled.text == "echo: Is the oven off?"
    assert handled.context is not None and handled.context["conversation_id"] == "01JTEST"
    TranscriptClient(NS).flush()
    rows = TranscriptClient(NS).recent(RecentTurns(channel="voice", limit=2)).turns
    turns = sorted(rows, key=lambda t: t.id)
    assert [(t.role, t.content) for t in turns] == [
        ("user", "Is the oven off?"), ("assistant", "echo: Is the oven off?")]
    assert turns[0].speaker == "Bob"  # the kitchen satellite's person


def upstream_for(where: tuple[str, int], server: FakeOpenAI, **context: str) -> str:
    """Ask for the garage code from a satellite; what the model was sent, as JSON."""
    server.mode = Mode.OK
    before = len(server.requests)
    answer = exchange(where, transcript("What is the garage code?", **context))
    assert answer is not None and Handled.is_type(answer.type), answer
    [request] = server.requests[before:]
    return json.dumps(request.body)


def test_a_satellite_mapped_to_a_person_speaks_as_that_person(
        running: Api, address: tuple[str, int], server: FakeOpenAI) -> None:
    ActorBackend(running.settings).remember(f"The garage code is {CODE}.", sensitive=True,
                                            person="Ana")
    # Ana's device (its device_id is the mapped id): her sensitive memory is hers
    assert CODE in upstream_for(address, server, device_id="device-bedroom")
    # Bob's satellite: another person's sensitive memory is not told
    assert CODE not in upstream_for(address, server, satellite_id="satellite-kitchen",
                                    device_id="device-bedroom")
    # a satellite nobody is mapped to: an unknown voice speaker
    assert CODE not in upstream_for(address, server, satellite_id="satellite-hall")


def test_the_satellites_room_is_said_in_the_prompt(
        address: tuple[str, int], server: FakeOpenAI) -> None:
    kitchen = json.loads(upstream_for(address, server, satellite_id="satellite-kitchen"))
    assert "The user is speaking in the kitchen." in kitchen["messages"][0]["content"]
    unmapped = json.loads(upstream_for(address, server, satellite_id="satellite-hall"))
    assert "The user is speaking in" not in unmapped["messages"][0]["content"]


def test_a_failing_turn_is_not_handled_with_the_reason(
        address: tuple[str, int], server: FakeOpenAI) -> None:
    before = len(server.requests)
    answer = exchange(address, transcript("x" * (MAX_TURN_CHARS + 1),
                                          satellite_id="satellite-kitchen"))
    assert answer is not None and NotHandled.is_type(answer.type), answer
    assert "not a turn" in (NotHandled.from_event(answer).text or "")
    assert len(server.requests) == before  # no model was asked
    answer = exchange(address, transcript("   "))
    assert answer is not None and NotHandled.is_type(answer.type)
    assert NotHandled.from_event(answer).text == "nothing was said"


def test_the_service_keeps_answering_after_a_malformed_event(
        address: tuple[str, int]) -> None:
    async def garbage(line: bytes) -> bytes:
        reader, writer = await asyncio.open_connection(*address)
        writer.write(line)
        await writer.drain()
        out = await reader.read()
        writer.close()
        return out

    for line in (b"this is not json\n",
                 # announces a gigabyte of data: closed at once, nothing waited for
                 b'{"type": "transcript", "data_length": 1000000000}\n'):
        assert asyncio.run(asyncio.wait_for(garbage(line), CLIENT_TIMEOUT_S)) == b""
    answer = exchange(address, Describe().event())
    assert answer is not None and Info.is_type(answer.type)


# -- the actor itself, built in this process ------------------------------------------

def actor_settings(running: Api, data: Path, **wyoming: Any) -> Settings:
    """Settings for an HTTP actor of this process, joined to the running runtime."""
    return load_settings(env={}, overrides={
        "store": {"data_dir": str(data)},
        "embedder": {"cache_dir": str(running.settings.embedder.cache_dir)},
        "runtime": {"namespace": NS}, "household": {"people": ["Ana", "Bob"]},
        "http": {"port": 0}, "wyoming": {"enabled": True, **wyoming},
    })


def local_addresses() -> list[str]:
    """The IPv4 addresses of this machine outside loopback (from /proc/net/fib_trie)."""
    try:
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
    except OSError:
        return []
    found: list[str] = []
    for prev, line in pairwise(lines):
        if "/32 host LOCAL" in line:
            ip = prev.split()[-1]
            if not ipaddress.ip_address(ip).is_loopback and ip not in found:
                found.append(ip)
    return found


@pytest.fixture
def lan_ip() -> str:
    found = local_addresses()
    if not found:
        pytest.skip("this machine has no IPv4 address outside loopback")
    return found[0]


@pytest.fixture
def actors() -> Iterator[list[HttpActor]]:
    made: list[HttpActor] = []
    yield made
    for actor in made:
        actor.stop()


def test_a_peer_outside_the_allow_list_is_refused(
        running: Api, tmp_path: Path, lan_ip: str, actors: list[HttpActor]) -> None:
    other = str(ipaddress.ip_address(lan_ip) + 1)
    refusing = HttpActor(actor_settings(running, tmp_path / "a", host=lan_ip, port=0,
                                        allowed_peers=[f"{other}/32"]))
    actors.append(refusing)
    where = urlsplit(refusing.wyoming_address())
    assert where.hostname == lan_ip and where.port, refusing.ping()
    # this client connects from lan_ip, which is not on the list: closed at once
    assert exchange((lan_ip, where.port), None) is None
    assert refusing.ping() == f"ok; wyoming {refusing.wyoming_address()}"

    allowing = HttpActor(actor_settings(running, tmp_path / "b", host=lan_ip, port=0,
                                        allowed_peers=[lan_ip]))
    actors.append(allowing)
    port = urlsplit(allowing.wyoming_address()).port
    assert port
    answer = exchange((lan_ip, port), Describe().event())
    assert answer is not None and Info.is_type(answer.type)


def test_outside_loopback_without_an_allow_list_it_refuses_to_start(
        running: Api, tmp_path: Path, actors: list[HttpActor]) -> None:
    before = listeners()
    actor = HttpActor(actor_settings(running, tmp_path, host="0.0.0.0", port=0))
    actors.append(actor)
    assert actor.wyoming_address() == ""
    ping = actor.ping()
    assert ping.startswith("ok; wyoming down: refusing to start: [wyoming] host 0.0.0.0"), ping
    assert "allowed_peers" in ping
    assert new_listeners(before, actor) == set()


def test_a_taken_port_stops_only_the_wyoming_service(
        running: Api, tmp_path: Path, actors: list[HttpActor]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        actor = HttpActor(actor_settings(running, tmp_path, port=port))
        actors.append(actor)
    assert actor.wyoming_address() == ""
    assert actor.address().startswith("http://127.0.0.1:")
    assert actor.ping().startswith(f"ok; wyoming down: cannot listen on 127.0.0.1:{port}")


def listeners() -> set[tuple[str, int]]:
    """The listening TCP sockets of this process (address, port), from /proc."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                port = int(fields[1].rsplit(":", 1)[1], 16)
                found.add((fields[1].rsplit(":", 1)[0], port))
    return found


def new_listeners(before: set[tuple[str, int]], actor: HttpActor) -> set[tuple[str, int]]:
    """What this process listens on now, beyond ``before`` and the actor's HTTP port."""
    http_port = urlsplit(actor.address()).port
    return {(a, p) for a, p in listeners() - before if p != http_port}


def test_off_by_default_nothing_listens(
        running: Api, tmp_path: Path, actors: list[HttpActor]) -> None:
    assert load_settings(env={}).wyoming.enabled is False
    before = listeners()
    settings = load_settings(env={}, overrides={
        "store": {"data_dir": str(tmp_path)}, "runtime": {"namespace": NS},
        "http": {"port": 0}})
    actor = HttpActor(settings)
    actors.append(actor)
    assert actor.wyoming_address() == "" and actor.ping() == "ok"
    assert new_listeners(before, actor) == set()


def test_reverie_run_writes_the_address_and_status_shows_it(
        ray_instance: str, tmp_path: Path, model_cache: Path) -> None:
    """``reverie run`` configured from the environment (REVERIE_WYOMING__*): the
    address in runtime.json as "wyoming", and in ``reverie status``."""
    env = runtime_env(tmp_path, "test-wyoming-run", model_cache, REVERIE_HTTP__PORT="0",
                      REVERIE_WYOMING__ENABLED="true", REVERIE_WYOMING__HOST="127.0.0.1",
                      REVERIE_WYOMING__PORT="0")
    with joined_runtime(env, ray_instance):
        wy = json.loads((tmp_path / "runtime.json").read_text())["wyoming"]
        parts = urlsplit(wy)
        assert parts.scheme == "tcp" and parts.hostname == "127.0.0.1" and parts.port, wy
        answer = exchange((parts.hostname, parts.port), Describe().event())
        assert answer is not None and Info.is_type(answer.type)
        assert status(env)["actors"]["http"] == f"ok; wyoming {wy}"


async def _discover(lan_ip: str, name: str, actor: HttpActor) -> tuple[list[str], int]:
    """Browse ``_wyoming._tcp`` on ``lan_ip`` as Home Assistant's zeroconf does:
    the addresses and port announced under ``name``; then stop ``actor`` and
    wait until the announcement is withdrawn."""
    from zeroconf import IPVersion, ServiceStateChange
    from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

    seen: dict[str, asyncio.Event] = {"added": asyncio.Event(), "removed": asyncio.Event()}
    loop = asyncio.get_running_loop()

    def changed(zeroconf: Any, service_type: str, name: str,
                state_change: ServiceStateChange) -> None:
        if name == wanted:
            key = "added" if state_change is ServiceStateChange.Added else "removed"
            loop.call_soon_threadsafe(seen[key].set)

    wanted = name
    zc = AsyncZeroconf(interfaces=[lan_ip], ip_version=IPVersion.V4Only)
    browser = AsyncServiceBrowser(zc.zeroconf, "_wyoming._tcp.local.", handlers=[changed])
    try:
        await seen["added"].wait()
        info = AsyncServiceInfo("_wyoming._tcp.local.", name)
        assert await info.async_request(zc.zeroconf, 10_000)
        assert info.port is not None
        await loop.run_in_executor(None, actor.stop)
        await seen["removed"].wait()
        return info.parsed_addresses(), info.port
    finally:
        await browser.async_cancel()
        await zc.async_close()


def test_zeroconf_announces_the_service_and_withdraws_it(
        running: Api, tmp_path: Path, lan_ip: str, actors: list[HttpActor]) -> None:
    actor = HttpActor(actor_settings(running, tmp_path, host=lan_ip, port=0,
                                     allowed_peers=[lan_ip], zeroconf=True))
    actors.append(actor)
    port = urlsplit(actor.wyoming_address()).port
    name = f"reverie-{socket.gethostname().split('.')[0]}._wyoming._tcp.local."
    addresses, announced_port = asyncio.run(asyncio.wait_for(
        _discover(lan_ip, name, actor), CLIENT_TIMEOUT_S))  # waits for the withdrawal too
    assert addresses == [lan_ip] and announced_port == port


def test_zeroconf_is_not_announced_for_a_loopback_host(
        running: Api, tmp_path: Path, actors: list[HttpActor]) -> None:
    from tests.waiting import wait_for

    actor = HttpActor(actor_settings(running, tmp_path, port=0, zeroconf=True))
    actors.append(actor)
    assert wait_for(lambda: "zeroconf" in actor.ping(), 60), actor.ping()
    assert actor.ping() == (f"ok; wyoming {actor.wyoming_address()} (zeroconf not announced:"
                            " host 127.0.0.1 is loopback: no other machine could reach it)")
