"""The REST memory routes against the real runtime (the actors on the test
session's Ray, the real embedder): browse, one memory, edit (recall follows),
pin and unpin, episodes, facts, the timeline, and the refusals (401, 400, 404,
422)."""

from __future__ import annotations

import http.client
import json
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit
from zoneinfo import ZoneInfo

import http_runtime
import pytest

from actors.handles import EpisodesClient, TranscriptClient
from actors.http.common import MAX_QUERY_CHARS
from actors.messages import AddEpisode, AppendTurns
from runtime.memories.episodes import EpisodeIn
from runtime.memories.transcript import TurnIn

NS = "test-http-mem"
# tokens bound to an audience ([http.tokens]): Ana on the chat channel, the
# household as a whole on it, and nobody in particular on the spoken channel
BOUND = {"ana": {"person": "Ana"}, "house": {}, "hall": {"channel": "voice"}}
ZONE = "Asia/Tokyo"  # nine hours from UTC, no summer time: a zone mistake shows


@dataclass
class Response:
    status_code: int
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


class Client:
    """Plain HTTP calls (http.client), with or without the bearer token."""

    def __init__(self, base: str, token: str | None) -> None:
        self.netloc = urlsplit(base).netloc
        self.headers = {} if token is None else {"Authorization": f"Bearer {token}"}

    def request(self, method: str, path: str, body: Any = None,
                params: dict[str, Any] | list[tuple[str, Any]] | None = None) -> Response:
        conn = http.client.HTTPConnection(self.netloc, timeout=120)
        headers = dict(self.headers)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if params:
            path = f"{path}?{urlencode(params)}"
        try:
            conn.request(method, path, body=data, headers=headers)
            r = conn.getresponse()
            return Response(r.status, r.read().decode())
        finally:
            conn.close()

    def get(self, path: str, **params: Any) -> Response:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: Any = None) -> Response:
        return self.request("POST", path, body)

    def patch(self, path: str, body: Any) -> Response:
        return self.request("PATCH", path, body)


class Api(http_runtime.Api):
    def client(self, token: str | None = "") -> Client:
        return Client(self.base, self.token if token == "" else token)


@pytest.fixture(scope="module")
def api(ray_instance: str, tmp_path_factory: pytest.TempPathFactory,
        model_cache: Path) -> Iterator[Api]:
    with http_runtime.http_runtime(NS, tmp_path_factory.mktemp("http-mem-data"), model_cache,
                                   household={"timezone": ZONE, "people": ["Ana", "Rui"]},
                                   http={"models": {"assistant": "offline"},
                                         "tokens": BOUND}) as started:
        yield Api(started.settings, started.base, started.token)


def tag() -> str:
    """A made-up word no other memory of the run shares."""
    return "zq" + uuid.uuid4().hex[:8]


def add_episode(gist: str) -> str:
    written = EpisodesClient(NS).add(AddEpisode(episode=EpisodeIn(
        channel="kitchen", source="user", gist=gist)))
    return f"episode:{written.episode_id}"


def add_turns(*turns: TurnIn) -> list[str]:
    ids = TranscriptClient(NS).append(AppendTurns(turns=list(turns))).ids
    return [f"turn:{i}" for i in ids]


def remember(c: Client, text: str) -> str:
    r = c.post("/v1/memories", {"text": text})
    assert r.status_code == 201, r.text
    return str(r.json()["ref"])


def refs(r: Response) -> list[str]:
    assert r.status_code == 200, r.text
    return [item["ref"] for item in r.json()["items"]]


def recalled(c: Client, query: str) -> list[str]:
    r = c.get("/v1/recall", q=query, limit=10)
    assert r.status_code == 200, r.text
    return [item["ref"] for item in r.json()["items"]]


@pytest.mark.parametrize("method,path", [
    ("GET", "/v1/memories"), ("GET", "/v1/memories/fact:1"),
    ("PATCH", "/v1/memories/episode:1"), ("POST", "/v1/memories/episode:1/pin"),
    ("POST", "/v1/memories/episode:1/unpin"), ("GET", "/v1/episodes"),
    ("GET", "/v1/facts"), ("GET", "/v1/timeline"),
])
@pytest.mark.parametrize("token", [None, "wrong-token"])
def test_without_the_token_401(api: Api, method: str, path: str, token: str | None) -> None:
    r = api.client(token).request(method, path, {"text": "x"} if method == "PATCH" else None)
    assert r.status_code == 401, r.text


def test_browse_by_kind_words_and_pages_and_get_one(api: Api) -> None:
    word = tag()
    c = api.client()
    [said] = add_turns(TurnIn(channel="kitchen", source="user", speaker="Ana",
                              content=f"the {word} plant needs water"))
    gist = add_episode(f"Ana and Rui repotted the {word} plant")
    fact = remember(c, f"The {word} plant lives on the balcony.")
    everything = c.get("/v1/memories", q=f"{word} plant")
    assert refs(everything) == [fact, gist, said]  # newest first
    assert everything.json()["total"] == 3
    assert refs(c.get("/v1/memories", q=word, kind="episode")) == [gist]
    assert refs(c.get("/v1/memories", q=word, kind="fact,turns")) == [fact, said]
    assert refs(c.request("GET", "/v1/memories", params=[
        ("q", word), ("kind", "turn"), ("kind", "fact")])) == [fact, said]
    assert refs(c.get("/v1/episodes", q=word)) == [gist]
    assert refs(c.get("/v1/facts", q=word)) == [fact]
    second = c.get("/v1/memories", q=word, limit=1, offset=1)
    assert refs(second) == [gist] and second.json()["total"] == 3
    assert refs(c.get("/v1/memories", q=word, order="oldest")) == [said, gist, fact]
    assert refs(c.get("/v1/memories", q=f"{word} balcony")) == [fact]  # every word
    assert refs(c.get("/v1/memories", q=f"{word} umbrella")) == []

    one = c.get(f"/v1/memories/{said}")
    assert one.status_code == 200, one.text
    view = one.json()
    assert view["text"] == f"Ana: the {word} plant needs water"
    assert (view["kind"], view["speaker"], view["channel"], view["level"]) == (
        "turn", "Ana", "kitchen", None)
    view = c.get(f"/v1/memories/{fact}").json()
    assert view["text"] == f"The {word} plant lives on the balcony."
    assert view["details"]["user_managed"] is True and view["level"] == "normal"


def test_remember_someones_sensitive_fact(api: Api) -> None:
    """As ``reverie remember --sensitive --person``: the fact is marked, and
    whose it is travels with it; a blank or over-long name is refused (422)."""
    c = api.client()
    word = tag()
    ref = c.post("/v1/memories", {"text": f"Rui's {word} PIN is 9182.", "sensitive": True,
                                  "person": "Rui"})
    assert ref.status_code == 201, ref.text
    view = c.get(f"/v1/memories/{ref.json()['ref']}").json()
    assert (view["sensitive"], view["person"]) == (True, "Rui")
    plain = c.get(f"/v1/memories/{remember(c, f'The {word} shed is green.')}").json()
    assert (plain["sensitive"], plain["person"]) == (False, None)
    for bad in ({"person": ""}, {"person": "x" * 201}, {"sensitive": "maybe"}):
        r = c.post("/v1/memories", {"text": f"The {word} gate squeaks.", **bad})
        assert r.status_code == 422, r.text
        assert next(iter(bad)) in r.text


def test_disabled_ones_are_flagged_or_left_out(api: Api) -> None:
    word = tag()
    c = api.client()
    hidden = add_episode(f"a {word} surprise party is planned")
    shown = add_episode(f"the {word} cake was ordered")
    assert c.post(f"/v1/memories/{hidden}/disable").status_code == 200
    flagged = c.get("/v1/memories", q=word).json()["items"]
    assert {i["ref"]: i["disabled"] for i in flagged} == {hidden: True, shown: False}
    assert refs(c.get("/v1/memories", q=word, include_disabled="false")) == [shown]


def test_edit_an_episode_and_recall_finds_the_new_words_not_the_old(api: Api) -> None:
    c = api.client()
    gist = add_episode("The family went to the aquarium in Lisbon and watched the otters "
                       "and the jellyfish.")
    assert gist in recalled(c, "aquarium otters jellyfish")
    r = c.patch(f"/v1/memories/{gist}", {
        "text": "The family went hiking in the Gerês mountains and swam in a waterfall."})
    assert r.status_code == 200, r.text
    assert r.json() == {"ref": gist, "now": gist}
    assert c.get(f"/v1/memories/{gist}").json()["text"].startswith("The family went hiking")
    assert gist in recalled(c, "hiking mountains waterfall")
    assert gist not in recalled(c, "aquarium otters jellyfish")
    assert gist not in refs(c.get("/v1/episodes", q="aquarium otters"))


def test_edit_a_fact_supersedes_it(api: Api) -> None:
    c = api.client()
    old = remember(c, "The bike lock code is 5521, the blue lock.")
    r = c.patch(f"/v1/memories/{old}", {"text": "The bike lock code is 9080, the blue lock."})
    assert r.status_code == 200, r.text
    new = r.json()["now"]
    assert r.json()["ref"] == old and new.startswith("fact:") and new != old
    now = c.get(f"/v1/memories/{new}").json()
    assert now["text"] == "The bike lock code is 9080, the blue lock."
    assert now["details"]["current"] is True and now["source"] == "user"
    before = c.get(f"/v1/memories/{old}").json()  # history kept
    assert before["details"]["current"] is False
    assert before["details"]["superseded_by"] == int(new.split(":")[1])
    assert new in recalled(c, "bike lock code")
    again = c.patch(f"/v1/memories/{old}", {"text": "1234"})  # history: edit the current one
    assert again.status_code == 400 and new in again.json()["error"]["message"]


def test_edit_refusals(api: Api) -> None:
    c = api.client()
    [said] = add_turns(TurnIn(channel="kitchen", source="user", content="I said this"))
    turn = c.patch(f"/v1/memories/{said}", {"text": "I said that"})
    assert turn.status_code == 400, turn.text
    assert "append-only" in turn.json()["error"]["message"]
    assert c.get(f"/v1/memories/{said}").json()["text"] == "user: I said this"
    missing = c.patch("/v1/memories/episode:987654321", {"text": "x"})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found"
    assert c.patch("/v1/memories/nonsense", {"text": "x"}).status_code == 400
    for body in ({"text": ""}, {"txt": "x"}, {"text": "x", "extra": 1}):
        assert c.patch(f"/v1/memories/{said}", body).status_code == 422, body


def test_pin_and_unpin(api: Api) -> None:
    c = api.client()
    gist = add_episode(f"the {tag()} wedding day")
    pinned = c.post(f"/v1/memories/{gist}/pin")
    assert pinned.status_code == 200, pinned.text
    assert pinned.json() == {"ref": gist, "change": "pin",
                             "detail": f"episode {gist.split(':')[1]} pinned"}
    view = c.get(f"/v1/memories/{gist}").json()
    assert view["pinned"] is True and view["level"] == "seared"
    assert c.post(f"/v1/memories/{gist}/unpin").status_code == 200
    view = c.get(f"/v1/memories/{gist}").json()
    assert view["pinned"] is False and view["level"] == "vivid"
    fact = remember(c, f"The {tag()} is the family's lucky number.")
    assert c.post(f"/v1/memories/{fact}/pin").status_code == 200
    assert c.get(f"/v1/memories/{fact}").json()["pinned"] is True

    [said] = add_turns(TurnIn(channel="kitchen", source="user", content="pin me"))
    turn = c.post(f"/v1/memories/{said}/pin")
    assert turn.status_code == 400 and "cannot be pinned" in turn.json()["error"]["message"]
    assert c.post("/v1/memories/fact:987654321/pin").status_code == 404
    assert c.post("/v1/memories/fact:987654321/unpin").status_code == 404


def test_get_refusals(api: Api) -> None:
    c = api.client()
    missing = c.get("/v1/memories/episode:987654321")
    assert missing.status_code == 404, missing.text
    assert missing.json()["error"]["message"] == "no episode 987654321"
    for bad in ("nonsense", "turn:0", "dream:3", "turn:x"):
        r = c.get(f"/v1/memories/{bad}")
        assert r.status_code == 400, (bad, r.text)
        assert "turn:<id>" in r.json()["error"]["message"] or "ids start" in r.text


def local(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(ZONE)).timestamp()


def test_timeline_windows_in_the_household_zone(api: Api) -> None:
    word = tag()
    times = ["2001-02-28T23:59:59", "2001-03-01T00:00:00", "2001-03-01T12:00:00",
             "2001-03-02T00:00:00"]
    made = add_turns(*(TurnIn(channel="diary", source="user", content=f"{word} entry {i}",
                              created_at=local(t)) for i, t in enumerate(times)))
    c = api.client()
    day = c.get("/v1/timeline", since="2001-03-01", until="2001-03-02")
    assert refs(day) == made[1:3] and day.json()["total"] == 2  # oldest first
    assert refs(c.get("/v1/timeline", since=str(local("2001-03-01T00:00:00")),
                      until=str(int(local("2001-03-02T00:00:00"))))) == made[1:3]
    assert refs(c.get("/v1/timeline", since="2001-02-28T15:00:00Z",
                      until="2001-03-01T12:00:00+09:00")) == [made[1]]
    assert refs(c.get("/v1/memories", since="2001-03-01", until="2001-03-02")) == [
        made[2], made[1]]
    assert refs(c.get("/v1/timeline", until="2001-03-01 00:00:01", limit=1, offset=1)) == [
        made[1]]


@pytest.mark.parametrize("path,params,field", [
    ("/v1/timeline", {"since": "yesterday"}, "since"),
    ("/v1/memories", {"until": "2001-13-01"}, "until"),
    ("/v1/memories", {"since": "nan"}, "since"),
    ("/v1/episodes", {"since": "2001-03-02", "until": "2001-03-01"}, "until"),
    ("/v1/memories", {"kind": "dream"}, "kind"),
    ("/v1/memories", {"order": "sideways"}, "order"),
    ("/v1/facts", {"limit": "0"}, "limit"),
    ("/v1/timeline", {"limit": "501"}, "limit"),
    ("/v1/memories", {"offset": "-1"}, "offset"),
    ("/v1/memories", {"include_disabled": "perhaps"}, "include_disabled"),
])
def test_malformed_parameters_422_name_the_field(api: Api, path: str, params: dict[str, str],
                                                 field: str) -> None:
    r = api.client().get(path, **params)
    assert r.status_code == 422, r.text
    assert any(e["loc"][-1] == field for e in r.json()["detail"]), r.text


def test_hostile_words_are_plain_words(api: Api) -> None:
    c = api.client()
    [near] = add_turns(TurnIn(channel="kitchen", source="user",
                              content=f"the {tag()} bakery near the station"))
    found = c.get("/v1/memories", q='"NEAR( AND *', kind="turn", limit=500)
    assert near in refs(found)
    assert refs(c.get("/v1/memories", q="*")) == []


@pytest.mark.parametrize("path", ["/v1/memories", "/v1/facts", "/v1/recall"])
def test_the_longest_legal_query_is_answered_and_a_longer_one_is_422(api: Api,
                                                                     path: str) -> None:
    """A search text of MAX_QUERY_CHARS four-byte characters (48 KB percent-encoded)
    is parsed and answered, never cut off with a reset; one more character is a
    422 naming ``q``."""
    c = api.client()
    longest = "\U0001f600" * MAX_QUERY_CHARS
    r = c.get(path, q=longest, since="2001-01-01", until="2099-01-01")
    assert r.status_code == 200, r.text
    # the same head arriving in pieces, as from a slow client: the server holds
    # an incomplete head of more than h11's default 16 KiB before the rest comes
    target = f"{path}?{urlencode({'q': longest, 'since': '2001-01-01'})}"
    head = (f"GET {target} HTTP/1.1\r\nHost: {c.netloc}\r\n"
            f"Authorization: {c.headers['Authorization']}\r\nConnection: close\r\n\r\n"
            ).encode()
    assert len(head) > 20_000
    host, port = c.netloc.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(head[:18_000])
        time.sleep(0.3)  # not a timing assertion: lets the server read the first piece
        sock.sendall(head[18_000:])
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.split(b"\r\n", 1)[0] == b"HTTP/1.1 200 OK", answer[:300]
    r = c.get(path, q=longest + "a")
    assert r.status_code == 422, r.text
    assert any(e["loc"][-1] == "q" for e in r.json()["detail"]), r.text


def test_openapi_documents_the_routes(api: Api) -> None:
    spec = api.client().get("/openapi.json").json()
    paths = spec["paths"]
    for path in ("/v1/memories", "/v1/memories/{ref}", "/v1/memories/{ref}/pin",
                 "/v1/memories/{ref}/unpin", "/v1/episodes", "/v1/facts", "/v1/timeline"):
        assert path in paths, path
    assert {"get", "patch", "delete"} <= set(paths["/v1/memories/{ref}"])
    assert "404" in paths["/v1/memories/{ref}"]["get"]["responses"]
    assert paths["/v1/timeline"]["get"]["tags"] == ["memories"]


# -- who sees what: a token bound to an audience (actors.http.audience) -------------

def bound(api: Api, name: str) -> Client:
    from actors.http.audience import tokens_dir

    path = tokens_dir(api.settings) / name
    assert path.stat().st_mode & 0o777 == 0o600
    return api.client(path.read_text().strip())


def test_a_bound_token_is_told_only_what_its_audience_may_be(api: Api) -> None:
    """Every way out (recall, the listing, the timeline, one memory, a change)
    follows the privacy rules for the token's audience; the admin token sees
    everything."""
    word = tag()
    admin = api.client()
    facts = {name: admin.post("/v1/memories", {"text": text, **marks}).json()["ref"]
             for name, text, marks in (
                 ("ana", f"Ana's {word} locker code is 4417.", {"sensitive": True,
                                                                  "person": "Ana"}),
                 ("rui", f"Rui's {word} locker code is 9182.", {"sensitive": True,
                                                                  "person": "Rui"}),
                 ("house", f"The {word} alarm code is 5521.", {"sensitive": True}),
                 ("plain", f"The {word} locker is by the door.", {}))}
    at = local("1999-06-01T10:00:00")
    turns = dict(zip(("ana", "rui", "house", "reply", "plain"), add_turns(
        TurnIn(channel="chat", source="user", speaker="Ana", sensitive=True, created_at=at,
               content=f"my {word} test results came back"),
        TurnIn(channel="chat", source="user", speaker="Rui", sensitive=True,
               created_at=at + 1, content=f"my {word} salary went up"),
        TurnIn(channel="chat", source="user", sensitive=True, created_at=at + 2,
               content=f"the {word} wifi password is hunter2"),
        TurnIn(channel="chat", source="assistant", role="assistant", sensitive=True,
               created_at=at + 3, content=f"the {word} code you asked for is 4417"),
        TurnIn(channel="chat", source="user", speaker="Rui", created_at=at + 4,
               content=f"the {word} garden needs weeding")), strict=True))
    sees = {"ana": {"ana", "house", "plain"}, "house": {"house", "plain"},
            "hall": {"plain"}}
    window = {"since": str(at - 1), "until": str(at + 10)}
    for name, seen in sees.items():
        c = bound(api, name)
        shown_facts = {facts[k] for k in seen}
        hidden = ({facts[k] for k in facts if k not in seen}
                  | {turns[k] for k in turns if k not in seen})
        found = set(recalled(c, f"{word} locker code"))
        assert found & hidden == set() and shown_facts <= found, name
        listed = c.get("/v1/memories", q=word, limit=100)
        assert set(refs(listed)) == shown_facts | {turns[k] for k in seen}, name
        assert listed.json()["total"] == len(refs(listed)), name
        paged = c.get("/v1/memories", q=word, limit=1, offset=1)
        assert paged.json()["total"] == len(refs(listed)), name
        assert refs(paged) == refs(listed)[1:2], name
        timeline = c.get("/v1/timeline", **window)
        assert refs(timeline) == [turns[k] for k in turns if k in seen], name
        assert timeline.json()["total"] == len(seen), name
        for ref in sorted(hidden):
            assert c.get(f"/v1/memories/{ref}").status_code == 404, (name, ref)
            assert c.post(f"/v1/memories/{ref}/not-sensitive").status_code == 404, (name, ref)
            assert c.request("DELETE", f"/v1/memories/{ref}").status_code == 400, (name, ref)
        for ref in sorted(shown_facts):
            assert c.get(f"/v1/memories/{ref}").status_code == 200, (name, ref)
    everything = set(facts.values()) | set(turns.values())
    assert set(refs(admin.get("/v1/memories", q=word, limit=100))) == everything
    for ref in everything:  # the bound tokens' refusals changed nothing
        assert admin.get(f"/v1/memories/{ref}").json()["sensitive"] == (
            ref not in (facts["plain"], turns["plain"]))


def test_a_bound_token_speaks_only_as_its_person(api: Api) -> None:
    """Its turns cannot claim another of the household's people, nor leave a
    spoken channel for a typed one; it cannot use the memory page."""
    ana, hall = bound(api, "ana"), bound(api, "hall")
    r = ana.post("/v1/turns", {"text": "what is my locker code?", "speaker": "Rui"})
    assert r.status_code == 403, r.text
    r = hall.post("/v1/turns", {"text": "what is the alarm code?", "channel": "chat"})
    assert r.status_code == 403, r.text
    r = ana.post("/v1/turns", {"text": "hello there"})
    assert r.status_code == 200, r.text
    said = api.client().get(f"/v1/memories/turn:{r.json()['turn_id']}").json()
    assert said["speaker"] == "Ana"
    page = ana.request("GET", "/")
    assert page.status_code == 303, page.text  # sent to the login: the page is the admin's
