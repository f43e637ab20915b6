"""Many households on one runtime (issue 26, item 3): one runtime on the test
session's Ray, its owners serving the hub's household and households
registered under ``[households]``, each with its own store and token. What
one household was told never comes out of another: not through the typed
clients (recall, timeline), nor the HTTP API, nor MCP (the ``mcp`` SDK), nor
an OpenAI-compatible chat (the ``openai`` client). Owners keep at most
``max_open`` households open and answer every one correctly after closing and
reopening it. Then, in process: the registry's ids and paths."""

from __future__ import annotations

import html
import re
import sqlite3
import stat
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx
import httpx2
import openai
import pytest
import ray
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientMetadata
from mcp_types import CallToolResult, TextContent

from actors import supervisor
from actors.cli.main import parser
from actors.common import BadRequest
from actors.handles import CronClient, HttpClient, RecallClient, TranscriptClient
from actors.http.app import load_or_create_token, token_path
from actors.messages import (
    Activity,
    AppendTurns,
    JobsStatus,
    Recall,
    RecentTurns,
    Remind,
    Tick,
)
from runtime.config import HUB_HOUSEHOLD, JOB_NAMES, Settings, load_settings
from runtime.memories.transcript import TurnIn
from runtime.store.households import Households, UnknownHousehold, check_id
from tests.oauth_client import Memory, field_of
from tests.waiting import wait_for

NS = "test-households"
MAX_OPEN = 2
# what each household was told: words no other household holds
TOLD = {"alpha": "The spare key hides under the heron statue by the pond.",
        "beta": "The safe code is zebra seven three nine one."}
ASK = {"alpha": "heron statue spare key", "beta": "safe code zebra"}
MARK = {"alpha": "heron", "beta": "zebra"}


@dataclass
class Hub:
    settings: Settings
    registry: Households
    base: str
    tokens: dict[str, str]


def tell(household: str, text: str, channel: str = "chat") -> int:
    ids = TranscriptClient(NS, household=household).append(AppendTurns(
        turns=[TurnIn(channel=channel, source="user", content=text)])).ids
    RecallClient(NS, household=household).sync()
    return ids[0]


@pytest.fixture(scope="module")
def hub(ray_instance: str, tmp_path_factory: pytest.TempPathFactory,
        model_cache: Path) -> Iterator[Hub]:
    data = tmp_path_factory.mktemp("households-data")
    settings = load_settings(env={}, overrides={
        "store": {"data_dir": str(data)}, "embedder": {"cache_dir": str(model_cache)},
        "runtime": {"namespace": NS}, "persona": {"global_dir": str(data / "persona")},
        "households": {"enabled": True, "max_open": MAX_OPEN},
        # one test job, run by hand (no check fires during the module)
        "jobs": {"check_every_s": 86400.0, "idle_after_s": 600.0,
                 "extra": {"ok": "tests.jobs_for_tests:ok"}, "disabled": list(JOB_NAMES)},
        "http": {"port": 0, "models": {"assistant": "offline"}}})
    registry = Households(settings)
    for household in TOLD:
        registry.add(household)
    tokens = {h: load_or_create_token(registry.settings_for(h))
              for h in (HUB_HOUSEHOLD, *TOLD)}
    sup = supervisor.start(settings)
    try:
        for household, text in TOLD.items():
            tell(household, text)
        yield Hub(settings, registry, HttpClient(NS).address(), tokens)
    finally:
        sup.stop()


def recalled(household: str, query: str) -> str:
    found = RecallClient(NS, household=household).recall(Recall(query=query, max_items=20))
    return " ".join(item.text for item in found.items)


# -- through the owners' clients -------------------------------------------------

def test_each_household_recalls_its_own_memories_only(hub: Hub) -> None:
    for household, other in (("alpha", "beta"), ("beta", "alpha")):
        assert MARK[household] in recalled(household, ASK[household])
        assert MARK[other] not in recalled(household, ASK[other])
        assert MARK[other] not in recalled(household, TOLD[other])
    # the hub's own household was told neither
    assert not any(m in recalled(HUB_HOUSEHOLD, TOLD[h]) for h, m in MARK.items())


def test_each_household_has_its_own_store(hub: Hub) -> None:
    for household in TOLD:
        where = hub.registry.root / household
        assert (where / "reverie.db").is_file()
        assert stat.S_IMODE(where.stat().st_mode) == 0o700
        assert token_path(hub.registry.settings_for(household)).parent == where
    assert len(set(hub.tokens.values())) == len(hub.tokens)


def test_a_household_not_served_is_refused(hub: Hub) -> None:
    with pytest.raises(BadRequest, match="not served"):
        TranscriptClient(NS, household="nobody").recent(RecentTurns(channel="chat"))
    with pytest.raises(BadRequest, match="not served"):
        RecallClient(NS, household="gamma-9").recall(Recall(query="safe code"))
    # a client of one household does not carry another's request
    with pytest.raises(BadRequest, match="household 'beta'"):
        RecallClient(NS, household="alpha").recall(Recall(query="code", household="beta"))
    # a raw caller's bad id never reaches a path
    handle = ray.get_actor("recall", namespace=NS)
    for bad in ("../beta", "Beta", "beta/..", "-x", "a" * 64):
        with pytest.raises(ray.exceptions.RayTaskError, match="household"):
            ray.get(handle.recall.remote({"query": "code", "household": bad}), timeout=60)


# -- through every way out of the HTTP server ---------------------------------------

def get(hub: Hub, household: str, path: str, token: str, **params: Any) -> httpx.Response:
    with httpx.Client(base_url=f"{hub.base}/households/{household}", timeout=60,
                      headers={"Authorization": f"Bearer {token}"}) as client:
        return client.get(path, params=params)


def texts(answer: httpx.Response | dict[str, Any] | None) -> str:
    """The memories' texts in an answer (not the query it echoes)."""
    if isinstance(answer, httpx.Response):
        assert answer.status_code == 200, answer.text
        answer = answer.json()
    assert answer is not None
    items = answer.get("items", answer.get("memories", []))
    return " ".join(str(item["text"]) for item in items)


def test_http_recall_and_timeline_stay_in_their_household(hub: Hub) -> None:
    for household, other in (("alpha", "beta"), ("beta", "alpha")):
        token = hub.tokens[household]
        assert MARK[household] in texts(get(hub, household, "/v1/recall", token,
                                            q=ASK[household]))
        assert MARK[other] not in texts(get(hub, household, "/v1/recall", token,
                                            q=ASK[other]))
        timeline = texts(get(hub, household, "/v1/timeline", token, expr="today", limit=200))
        assert MARK[household] in timeline and MARK[other] not in timeline
        browse = texts(get(hub, household, "/v1/memories", token, limit=200))
        assert MARK[household] in browse and MARK[other] not in browse


def test_a_token_acts_in_its_own_household_only(hub: Hub) -> None:
    # another household's token, the hub's token: refused as any wrong token
    assert get(hub, "alpha", "/v1/recall", hub.tokens["beta"], q="code").status_code == 401
    assert get(hub, "beta", "/v1/recall", hub.tokens["alpha"], q="key").status_code == 401
    assert get(hub, "alpha", "/v1/recall", hub.tokens[HUB_HOUSEHOLD], q="k").status_code == 401
    # a household's token at the hub's own routes
    with httpx.Client(base_url=hub.base, timeout=60) as client:
        at_hub = client.get("/v1/recall", params={"q": "key"},
                            headers={"Authorization": f"Bearer {hub.tokens['alpha']}"})
        assert at_hub.status_code == 401
        hub_own = client.get("/v1/recall", params={"q": ASK["alpha"]},
                             headers={"Authorization": f"Bearer {hub.tokens[HUB_HOUSEHOLD]}"})
        assert MARK["alpha"] not in texts(hub_own)
    # no such household, or no id at all: not found, whatever the token
    for name in ("nobody", "a.b", "ALPHA", "_x"):
        assert get(hub, name, "/v1/recall", hub.tokens["alpha"], q="k").status_code == 404


@asynccontextmanager
async def mcp_client(hub: Hub, household: str) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {hub.tokens[household]}"}
    # a loaded machine answers slower than httpx's default 5 s read timeout
    async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
        url = f"{hub.base}/households/{household}/mcp"
        async with Client(streamable_http_client(url, http_client=http),
                          mode="legacy") as client:
            yield client


def mcp_call(hub: Hub, household: str, tool: str, arguments: dict[str, Any]) -> str:
    async def go() -> CallToolResult:
        async with mcp_client(hub, household) as client:
            return await client.call_tool(tool, arguments)

    result = anyio.run(go)
    block = result.content[0]
    assert isinstance(block, TextContent) and not result.is_error, result
    return texts(result.structured_content)


def test_mcp_recall_and_timeline_stay_in_their_household(hub: Hub) -> None:
    for household, other in (("alpha", "beta"), ("beta", "alpha")):
        mine = mcp_call(hub, household, "recall", {"query": ASK[household], "limit": 20})
        assert MARK[household] in mine
        theirs = mcp_call(hub, household, "recall", {"query": ASK[other], "limit": 20})
        assert MARK[other] not in theirs
        timeline = mcp_call(hub, household, "timeline", {"expr": "today", "limit": 100})
        assert MARK[household] in timeline and MARK[other] not in timeline


# -- MCP's OAuth and the memory page, as Home Assistant and a browser reach them ------

REDIRECT = "http://127.0.0.1:9/callback"  # never fetched: the browser reads the redirect


def form_action(page: str, form_id: str) -> str:
    found = re.search(rf'<form method="post" action="([^"]+)" id="{form_id}">', page)
    assert found, f"no form {form_id} in the page"
    return html.unescape(found.group(1))


@dataclass
class Browser:
    """The person approving in a browser: it follows each ``Location`` as a
    browser does (root-relative: on the same host), keeps cookies by path, and
    logs in on the memory page of the household it is sent to."""

    origin: str
    token: str
    approved: list[str] = field(default_factory=list)   # the approval pages' addresses
    result: AuthorizationCodeResult | None = None

    async def approve(self, authorization_url: str) -> None:
        async with httpx2.AsyncClient(timeout=60) as web:
            asked = await web.get(authorization_url)
            assert asked.status_code in (302, 303), asked.text
            approval = self.origin + asked.headers["location"]
            self.approved.append(approval)
            first = await web.get(approval)
            assert first.status_code == 303, first.text
            form = await web.get(self.origin + first.headers["location"])
            assert form.status_code == 200, form.text
            login = await web.post(self.origin + form_action(form.text, "login"), data={
                "token": self.token, "next": field_of(form.text, "next")})
            assert login.status_code == 303, login.text
            assert self.origin + login.headers["location"] == approval
            page = await web.get(approval)
            assert page.status_code == 200, page.text
            answer = await web.post(self.origin + form_action(page.text, "approve"), data={
                "csrf": field_of(page.text, "csrf"), "request": field_of(page.text, "request"),
                "person": "", "decision": "approve"})
            assert answer.status_code == 303, answer.text
            query = parse_qs(urlsplit(answer.headers["location"]).query)
            self.result = AuthorizationCodeResult(code=query["code"][0],
                                                  state=query.get("state", [None])[0])

    async def callback(self) -> AuthorizationCodeResult:
        assert self.result is not None
        return self.result


def test_mcp_oauth_discovers_and_approves_in_its_own_household(hub: Hub) -> None:
    """Home Assistant's MCP integration connects by OAuth only: for a household
    served under ``/households/ID/`` the 401, the metadata at the path-inserted
    well-known URLs, the approval on that household's memory page and the
    tokens all belong to that household, driven by the ``mcp`` SDK's client."""
    base = f"{hub.base}/households/alpha"
    refused = httpx2.post(f"{base}/mcp", headers={"Authorization": "Bearer nope"},
                          json={}, timeout=60)
    assert refused.status_code == 401
    prm = f"{hub.base}/.well-known/oauth-protected-resource/households/alpha/mcp"
    assert f'resource_metadata="{prm}"' in refused.headers["www-authenticate"]
    meta = httpx2.get(prm, timeout=60).json()
    assert meta["resource"] == f"{base}/mcp" and meta["authorization_servers"] == [base]
    server = httpx2.get(f"{hub.base}/.well-known/oauth-authorization-server/households/alpha",
                        timeout=60).json()
    assert server["issuer"] == base and server["token_endpoint"] == f"{base}/token"
    # the hub's own metadata stays the hub's
    assert httpx2.get(f"{hub.base}/.well-known/oauth-authorization-server",
                      timeout=60).json()["issuer"].rstrip("/") == hub.base

    storage = Memory()
    browser = Browser(hub.base, hub.tokens["alpha"])
    auth = OAuthClientProvider(
        f"{base}/mcp", OAuthClientMetadata(
            redirect_uris=[REDIRECT], client_name="Home Assistant",  # type: ignore[list-item]
            grant_types=["authorization_code", "refresh_token"], response_types=["code"]),
        storage, redirect_handler=browser.approve, callback_handler=browser.callback)

    async def recall(url: str, query: str) -> CallToolResult:
        async with httpx2.AsyncClient(auth=auth, timeout=60) as http:
            async with Client(streamable_http_client(url, http_client=http),
                              mode="legacy") as client:
                return await client.call_tool("recall", {"query": query, "limit": 20})

    mine = anyio.run(recall, f"{base}/mcp", ASK["alpha"])
    assert browser.approved and browser.approved[0].startswith(f"{base}/oauth/approve?")
    assert MARK["alpha"] in texts(mine.structured_content)
    theirs = anyio.run(recall, f"{base}/mcp", ASK["beta"])
    assert MARK["beta"] not in texts(theirs.structured_content)
    # alpha's OAuth token opens neither beta's MCP nor the hub's
    assert storage.tokens is not None
    access = storage.tokens.access_token
    for other in (f"{hub.base}/households/beta/mcp", f"{hub.base}/mcp"):
        assert httpx2.post(other, headers={"Authorization": f"Bearer {access}"},
                           json={}, timeout=60).status_code == 401


def test_the_memory_page_of_a_household_lives_under_its_path(hub: Hub) -> None:
    base = f"{hub.base}/households/alpha"
    with httpx.Client(timeout=60) as web:
        first = web.get(f"{base}/")
        assert first.status_code == 303 and first.headers["location"] == (
            "/households/alpha/login")
        form = web.get(hub.base + first.headers["location"])
        assert form_action(form.text, "login") == "/households/alpha/login"
        # another household's token, the hub's: not this household's login
        for token in (hub.tokens["beta"], hub.tokens[HUB_HOUSEHOLD]):
            assert web.post(f"{base}/login", data={"token": token}).status_code == 401
        login = web.post(f"{base}/login", data={"token": hub.tokens["alpha"]})
        assert login.status_code == 303 and login.headers["location"] == "/households/alpha/"
        assert "path=/households/alpha" in login.headers["set-cookie"].lower()
        page = web.get(hub.base + login.headers["location"])
        assert page.status_code == 200 and MARK["alpha"] in page.text
        assert MARK["beta"] not in page.text
        assert 'href="/households/alpha/timeline"' in page.text
        assert not re.search(r'(?:href|action|src)="/(?!households/alpha/)', page.text)
        # the household's session opens neither beta's page nor the hub's
        assert web.get(f"{hub.base}/households/beta/").status_code == 303
        assert web.get(f"{hub.base}/").status_code == 303


def test_openai_chat_stays_in_its_household(hub: Hub) -> None:
    for household, other in (("alpha", "beta"), ("beta", "alpha")):
        client = openai.OpenAI(base_url=f"{hub.base}/households/{household}/v1",
                               api_key=hub.tokens[household], max_retries=0)
        asked = f"What do you know about the {ASK[other]}? ({uuid.uuid4().hex[:6]})"
        theirs = client.chat.completions.create(
            model="assistant", messages=[{"role": "user", "content": asked}],
            extra_headers={"X-Reverie-Channel": "voice"})
        assert MARK[other] not in (theirs.choices[0].message.content or "")
        # on another channel than the one told (a channel's own turns are its history)
        mine = client.chat.completions.create(
            model="assistant", messages=[{"role": "user", "content": ASK[household]}],
            extra_headers={"X-Reverie-Channel": "voice"})
        assert MARK[household] in (mine.choices[0].message.content or "")
        # the turn was written in the household that asked, and only there
        rows = TranscriptClient(NS, household=household).recent(
            RecentTurns(channel="voice", limit=50)).turns
        assert any(asked == r.content for r in rows)
        rows = TranscriptClient(NS, household=other).recent(
            RecentTurns(channel="voice", limit=50)).turns
        assert not any(asked == r.content for r in rows)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{hub.base}/households/{other}/v1",
                          api_key=hub.tokens[household], max_retries=0
                          ).chat.completions.create(
                model="assistant", messages=[{"role": "user", "content": "hello"}])


def test_turns_ollama_and_streams_stay_in_their_household(hub: Hub) -> None:
    import ollama

    for household, other in (("alpha", "beta"), ("beta", "alpha")):
        headers = {"Authorization": f"Bearer {hub.tokens[household]}",
                   "X-Reverie-Channel": "voice"}
        base = f"{hub.base}/households/{household}"
        with httpx.Client(base_url=base, headers=headers, timeout=120) as client:
            for ask, wanted in ((ASK[household], True), (ASK[other], False)):
                turn = client.post("/v1/turns", json={"text": ask, "channel": "voice"})
                assert turn.status_code == 200, turn.text
                assert (MARK[household] in turn.json()["text"]) is wanted
                assert MARK[other] not in turn.json()["text"]
        chat = ollama.Client(host=base, headers=headers)
        for stream in (False, True):
            for ask, wanted in ((ASK[household], True), (ASK[other], False)):
                messages = [{"role": "user", "content": ask}]
                if stream:
                    said = "".join(p.message.content or "" for p in chat.chat(
                        model="reverie", stream=True, messages=messages))
                else:
                    said = chat.chat(model="reverie", messages=messages).message.content or ""
                assert (MARK[household] in said) is wanted and MARK[other] not in said
        streamed = openai.OpenAI(base_url=f"{base}/v1", api_key=hub.tokens[household],
                                 max_retries=0).chat.completions.create(
            model="assistant", stream=True, extra_headers={"X-Reverie-Channel": "voice"},
            messages=[{"role": "user", "content": ASK[household]}])
        said = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        assert MARK[household] in said and MARK[other] not in said


# -- the owners' LRU ------------------------------------------------------------------

def test_more_households_than_max_open_all_answer(hub: Hub) -> None:
    many = [f"lru-{i}" for i in range(MAX_OPEN + 3)]
    words = {h: f"zq{uuid.uuid4().hex[:10]}" for h in many}
    for household in many:
        hub.registry.add(household)
        tell(household, f"The lantern code word is {words[household]}.")
    for _ in range(2):  # every one closed and opened again
        for household in many:
            text = recalled(household, f"lantern code word {words[household]}")
            assert words[household] in text
            assert not any(words[o] in text for o in many if o != household)
    recall = ray.get_actor("recall", namespace=NS)
    state = ray.get(recall.households.remote(), timeout=60)
    assert len(state["open"]) <= MAX_OPEN and state["closed"] >= len(many)
    # the transcript's owner too: each household's turns from its own store
    for household in many:
        rows = TranscriptClient(NS, household=household).recent(RecentTurns(channel="chat"))
        assert [words[household] in r.content for r in rows.turns] == [True]


# -- jobs per household, each behind its own idle gate ---------------------------------

def job_runs(hub: Hub, household: str) -> list[tuple[str, str]]:
    path = hub.registry.settings_for(household).store.path
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return list(db.execute("SELECT job, outcome FROM job_runs"))


def test_jobs_run_per_household_behind_its_own_gate(hub: Hub) -> None:
    hub.registry.add("quiet")
    t = time.time()
    busy, quiet = CronClient(NS, household="alpha"), CronClient(NS, household="quiet")
    busy.activity(Activity(at=t))
    # alpha's user was just here: its gate is closed; quiet's, never used, is open
    assert not busy.status(JobsStatus(now=t + 1)).idle.idle
    assert quiet.status(JobsStatus(now=t + 1)).idle.idle
    assert busy.tick(Tick(now=t + 1, wait=True)).started == []
    ticked = quiet.tick(Tick(now=t + 1, wait=True))
    assert ticked.started == ["ok"] and [r.outcome for r in ticked.runs] == ["ok"]
    # the run is recorded in quiet's own store, and nowhere else
    assert job_runs(hub, "quiet") == [("ok", "ok")]
    assert job_runs(hub, "alpha") == [] and job_runs(hub, HUB_HOUSEHOLD) == []


def test_a_households_reminder_fires_when_due_not_at_the_next_sweep(hub: Hub) -> None:
    """The sweep runs once a day here (``check_every_s``): only the reminder's
    own timer in the Cron actor's sweep thread can fire it in time."""
    text = f"feed the heron by the pond ({uuid.uuid4().hex[:6]})"
    made = CronClient(NS, household="alpha").remind(Remind(
        text=text, when="in 1 minute", channel="chat", now=time.time() - 55))

    def said(household: str) -> list[float]:
        rows = TranscriptClient(NS, household=household).recent(
            RecentTurns(channel="chat", limit=50)).turns
        return [r.created_at for r in rows if text in r.content]

    assert wait_for(lambda: said("alpha"), timeout=120), "the reminder did not fire"
    assert said("alpha")[0] >= made.due_at
    assert said("beta") == []


def test_the_sweep_ticks_every_household_but_the_hubs(hub: Hub) -> None:
    hub.registry.add("swept")
    now = time.time()
    for household in hub.registry.ids():  # every other one: its user was just here
        if household not in (HUB_HOUSEHOLD, "swept"):
            CronClient(NS, household=household).activity(Activity(at=now))
    ticked = ray.get(ray.get_actor("cron", namespace=NS).sweep.remote(), timeout=300)
    assert set(ticked) == set(hub.registry.ids()) - {HUB_HOUSEHOLD}
    assert job_runs(hub, "swept") == [("ok", "ok")]
    assert job_runs(hub, "alpha") == [] and job_runs(hub, HUB_HOUSEHOLD) == []


# -- reverie household add | stop | export | delete --------------------------------------

def household(hub: Hub, *argv: str) -> int:
    """``reverie household ...`` as the command runs it, on the module's runtime."""
    args = parser().parse_args(["household", *argv])
    return int(args.func(args, hub.settings))


def test_a_household_is_added_stopped_exported_and_deleted(hub: Hub, tmp_path: Path) -> None:
    assert household(hub, "add", "gone-soon") == 0
    token = token_path(hub.registry.settings_for("gone-soon")).read_text().strip()
    tell("gone-soon", "The attic ladder creaks on the third step.")
    assert "creaks" in recalled("gone-soon", "attic ladder step")
    copy = tmp_path / "gone-soon.db"
    assert household(hub, "export", "gone-soon", "--to", str(copy)) == 0
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600
    with sqlite3.connect(f"file:{copy}?mode=ro", uri=True) as db:
        assert [r[0] for r in db.execute("SELECT content FROM transcript")] == [
            "The attic ladder creaks on the third step."]
    # stopped: closed by every owner, refused by them and by the HTTP server
    assert household(hub, "stop", "gone-soon") == 0
    with pytest.raises(BadRequest, match="not served"):
        recalled("gone-soon", "attic ladder")
    assert get(hub, "gone-soon", "/v1/recall", token, q="attic").status_code == 404
    # added again: served from its store as it was
    assert household(hub, "add", "gone-soon") == 0
    assert "creaks" in recalled("gone-soon", "attic ladder step")
    assert "creaks" in texts(get(hub, "gone-soon", "/v1/recall", token, q="attic ladder"))
    # deleted for good
    assert household(hub, "delete", "gone-soon", "--yes") == 0
    assert not (hub.registry.root / "gone-soon").exists()
    with pytest.raises(BadRequest, match="not served"):
        recalled("gone-soon", "attic ladder")
    with pytest.raises(ValueError, match="not a household id"):
        household(hub, "add", "../gone")


# -- the registry, in process ---------------------------------------------------------

def test_a_household_id_is_checked_and_names_its_path(tmp_path: Path) -> None:
    settings = load_settings(env={}, overrides={
        "store": {"data_dir": str(tmp_path)}, "households": {"enabled": True},
        "replica": {"url": "s3://bucket/hub"}})
    registry = Households(settings)
    for bad in ("", "../x", "a/b", "A", "-a", "a" * 64, "a b", "é", "a\n", ".", "x.y"):
        with pytest.raises(ValueError):
            check_id(bad)
        with pytest.raises(ValueError):
            registry.dir_of(bad)
    assert check_id("a" * 63) and check_id("0-smith")
    registry.add("smith")
    own = registry.settings_for("smith")
    assert own.store.path == tmp_path / "households" / "smith" / "reverie.db"
    assert own.household.id == "smith"
    assert own.replica.url == "s3://bucket/hub/households/smith"
    assert registry.ids() == [HUB_HOUSEHOLD, "smith"]
    assert registry.settings_for(HUB_HOUSEHOLD) is settings
    with pytest.raises(UnknownHousehold):
        registry.settings_for("jones")
    with pytest.raises(ValueError):
        registry.add(HUB_HOUSEHOLD)
    # off: the hub's household is the only one, whatever is on disk
    off = Households(settings.model_copy(update={"households": settings.households.model_copy(
        update={"enabled": False})}))
    assert off.ids() == [HUB_HOUSEHOLD] and not off.known("smith")
    registry.delete("smith")
    assert registry.ids() == [HUB_HOUSEHOLD]


def test_a_move_whose_mover_died_lets_the_household_go_when_its_lease_runs_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mover killed mid-move never ends it: its owners hold the household only
    while the lease is renewed, then serve it again where its route says; a
    mover whose lease ran out learns it (and gives the move up)."""
    from actors import households as owners
    from actors.common import HouseholdElsewhere, HouseholdMoving

    now = [1000.0]
    monkeypatch.setattr(owners.time, "monotonic", lambda: now[0])
    settings = load_settings(env={}, overrides={
        "store": {"data_dir": str(tmp_path)}, "households": {"enabled": True}})
    Households(settings).add("smith")
    served = owners.Served(settings, lambda own: object(), "transcript")
    served.route = lambda household: "hub"
    with served.lease("smith"):
        pass
    assert served.begin_move("smith", wait_s=60, lease_s=30)  # it was open: closed
    now[0] += 25
    with pytest.raises(HouseholdMoving):
        served.lease("smith").__enter__()
    assert served.renew_move("smith", 30)  # the mover is alive: 30 s more
    now[0] += 25
    with pytest.raises(HouseholdMoving):
        served.lease("smith").__enter__()
    now[0] += 10  # no renewal: the mover died; the route still says here
    with served.lease("smith") as one:
        assert one is not None
    assert not served.renew_move("smith", 30)  # a mover back late must give up
    # a mover that died after the routing flipped: refused as served elsewhere
    assert served.begin_move("smith", wait_s=60, lease_s=30)
    served.route = lambda household: "b"
    now[0] += 31
    with pytest.raises(HouseholdElsewhere):
        served.lease("smith").__enter__()


def test_the_sweep_thread_fires_each_households_reminders_when_due(tmp_path: Path) -> None:
    """In process, on a controlled clock: the Cron owner's router reads each
    household's next reminder at start and after a reminder is set, fires a
    household's when it is due (not at the next sweep), and tries one whose
    firing failed again a while later."""
    from actors.households import REMINDER_RETRY_S, serving
    from runtime.time.clock import ManualClock

    settings = load_settings(env={}, overrides={
        "store": {"data_dir": str(tmp_path)}, "households": {"enabled": True}})
    registry = Households(settings)
    for one in ("a1", "a2", "a3"):
        registry.add(one)
    clock = ManualClock(1000.0)
    due: dict[str, float | None] = {"a1": 1010.0, "a2": None, "a3": 1005.0}
    fired: list[str] = []
    failing = {"a3"}

    class Household:
        def __init__(self, own: Settings, clock: Any = None, background: bool = True) -> None:
            self.name = own.household.id

        def next_reminder(self, msg: object = None) -> float | None:
            return due.get(self.name)

        def fire_due(self, msg: object = None) -> list[int]:
            if self.name in failing:
                raise RuntimeError("the transcript did not answer")
            fired.append(self.name)
            due[self.name] = None
            return [1]

        def remind(self, msg: object = None) -> str:
            due[self.name] = 1020.0
            return "made"

    router: Any = serving(Household, "CronForTests", sweep=True)(
        settings, clock=clock, background=False)
    router.served.route = lambda household: "hub"
    router._scan_due()  # what the sweep thread does first
    assert router._due == {"a1": 1010.0, "a3": 1005.0}
    assert router.remind({"household": "a2"}) == "made"
    assert router._due["a2"] == 1020.0
    clock.advance(9)  # 1009: a3 due (and failing), a1 not yet
    assert router.fire_due_reminders() == ["a3"] and fired == []
    assert router._due["a3"] == 1009 + REMINDER_RETRY_S  # tried again later
    clock.advance(1)  # 1010: a1 due
    assert router.fire_due_reminders() == ["a1"] and fired == ["a1"]
    assert "a1" not in router._due
    failing.clear()
    clock.set(1009 + REMINDER_RETRY_S)
    assert sorted(router.fire_due_reminders()) == ["a2", "a3"]
    assert sorted(fired) == ["a1", "a2", "a3"] and router._due == {}


def test_the_http_server_keeps_at_most_max_open_household_apps(tmp_path: Path) -> None:
    """In process: ``/households/ID/`` apps are built on demand and at most
    ``households.max_open`` kept; the least recently used one with no request
    under way is let go (its lifespan stopped) and built again when asked."""
    from actors.http.households import HouseholdsApp

    settings = load_settings(env={}, overrides={
        "store": {"data_dir": str(tmp_path)},
        "households": {"enabled": True, "max_open": 2}})
    registry = Households(settings)
    for one in ("a1", "a2", "a3"):
        registry.add(one)
    stopped: list[str] = []
    release, entered = anyio.Event(), anyio.Event()

    def build(own: Settings) -> Any:
        name = own.household.id

        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "lifespan":
                while True:
                    message = await receive()
                    if message["type"] == "lifespan.startup":
                        await send({"type": "lifespan.startup.complete"})
                    else:
                        stopped.append(name)
                        await send({"type": "lifespan.shutdown.complete"})
                        return
            if scope["path"] == "/slow":
                entered.set()
                await release.wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": name.encode()})
        return app

    async def hub(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("not the hub's")

    served = HouseholdsApp(hub, settings, build)

    async def go() -> None:
        transport = httpx.ASGITransport(app=served)
        async with httpx.AsyncClient(transport=transport, base_url="http://hub") as http:
            async def get(one: str, path: str = "/") -> str:
                return (await http.get(f"/households/{one}{path}")).text

            assert [await get("a1"), await get("a2")] == ["a1", "a2"]
            assert await get("a1") == "a1"  # a1 used last: a2 is the oldest
            assert await get("a3") == "a3"
            assert served.apps() == ["a1", "a3"] and stopped == ["a2"]
            async with anyio.create_task_group() as tg:  # a request under way in a1
                tg.start_soon(get, "a1", "/slow")
                await entered.wait()
                assert await get("a3") == "a3"
                assert await get("a2") == "a2"  # built again; a1 busy, so a3 goes
                assert served.apps() == ["a1", "a2"] and stopped == ["a2", "a3"]
                release.set()
            assert served.built == 4

    anyio.run(go)
