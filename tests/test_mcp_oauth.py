"""OAuth 2.0 for ``/mcp`` as Home Assistant's MCP client performs it, driven by
the ``mcp`` SDK's own client and its OAuth flow (``OAuthClientProvider``):
discovery from the 401's ``resource_metadata``, dynamic registration, the
person's approval on the memory page (logged in with the token, CSRF form),
the code exchange with PKCE, then tool calls. Against the real runtime (the
actors on the test session's Ray): the runtime's own HTTP server for the 401,
and the same app served here over the same actors with a manual clock, so a
token's expiry is reached by moving the clock, not by waiting."""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
import socket
import stat
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx2
import pytest
from http_runtime import Api, http_runtime
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientMetadata, OAuthToken
from mcp_types import CallToolResult, TextContent

from actors.http.app import make_app
from actors.http.backend import ActorBackend
from actors.http.oauth import STORE_FILE
from runtime.time.clock import ManualClock
from tests.oauth_client import Memory, field_of
from tests.waiting import wait_for

NS = "test-mcp-oauth"
REDIRECT = "http://127.0.0.1:9/callback"  # never fetched: the handler reads the redirect
ANA_SECRET = "Ana's bank card PIN is 4417"
BEN_SECRET = "Ben's insulin dose is 12 units"


@dataclass
class Served:
    api: Api          # the runtime (its own HTTP server at api.base)
    base: str         # the same app, served here with the manual clock
    clock: ManualClock
    data: Path


@pytest.fixture(scope="module")
def served(ray_instance: str, tmp_path_factory: pytest.TempPathFactory,
           model_cache: Path) -> Iterator[Served]:
    import uvicorn

    data = tmp_path_factory.mktemp("mcp-oauth-data")
    with http_runtime(NS, data, model_cache, household={"people": ["Ana", "Ben"]},
                      http={"models": {"assistant": "offline"}}) as api:
        clock = ManualClock(time.time())
        app = make_app(api.settings, api.token, ActorBackend(api.settings), clock=clock)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                               lifespan="on"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        assert wait_for(lambda: server.started, timeout=60), "the app did not start"
        try:
            yield Served(api, f"http://127.0.0.1:{port}", clock, data)
        finally:
            server.should_exit = True
            thread.join(timeout=30)
            sock.close()


# -- the client side: token storage, the person approving, the callback -------------

@dataclass
class Person:
    """The household member approving on the memory page (logged in with the token)."""

    base: str
    token: str
    person: str = ""
    decision: str = "approve"
    seen: list[str] = field(default_factory=list)   # the approval pages shown
    result: AuthorizationCodeResult | None = None

    async def approve(self, authorization_url: str) -> None:
        async with httpx2.AsyncClient(base_url=self.base, timeout=60) as browser:
            # /authorize (the SDK's handler) sends the browser to the approval page,
            # which is behind the memory page's login, and the login comes back to it
            asked = await browser.get(authorization_url)
            assert asked.status_code in (302, 303), asked.text
            approval = asked.headers["location"]
            assert approval.startswith("/oauth/approve?request=")
            first = await browser.get(approval)
            assert first.status_code == 303 and first.headers["location"].startswith("/login")
            form = await browser.get(first.headers["location"])
            login = await browser.post("/login", data={
                "token": self.token, "next": field_of(form.text, "next")})
            assert login.status_code == 303 and login.headers["location"] == approval
            page = await browser.get(approval)
            assert page.status_code == 200, page.text
            self.seen.append(page.text)
            answer = await browser.post("/oauth/approve", data={
                "csrf": field_of(page.text, "csrf"), "request": field_of(page.text, "request"),
                "person": self.person, "decision": self.decision})
            assert answer.status_code == 303, answer.text
            back = answer.headers["location"]
            assert back.startswith(REDIRECT + "?")
            query = parse_qs(urlsplit(back).query)
            self.result = AuthorizationCodeResult(code=query.get("code", [""])[0],
                                                  state=query.get("state", [None])[0])

    async def callback(self) -> AuthorizationCodeResult:
        assert self.result is not None
        return self.result


def provider(base: str, storage: Memory, person: Person) -> OAuthClientProvider:
    return OAuthClientProvider(
        f"{base}/mcp",
        OAuthClientMetadata(redirect_uris=[REDIRECT], client_name="Home Assistant",  # type: ignore[list-item]
                            grant_types=["authorization_code", "refresh_token"],
                            response_types=["code"]),
        storage, redirect_handler=person.approve, callback_handler=person.callback)


@asynccontextmanager
async def connected(base: str, auth: Any) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(auth=auth, timeout=60) as http:
        async with Client(streamable_http_client(f"{base}/mcp", http_client=http),
                          mode="legacy") as client:
            yield client


def text(result: CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


def call(base: str, auth: Any, tool: str, arguments: dict[str, Any]) -> CallToolResult:
    async def go() -> CallToolResult:
        async with connected(base, auth) as client:
            return await client.call_tool(tool, arguments)

    return anyio.run(go)


def mcp_status(base: str, bearer: str) -> httpx2.Response:
    """A bare initialize on /mcp with this bearer token."""
    return httpx2.post(f"{base}/mcp", headers={
        "Authorization": f"Bearer {bearer}", "Accept": "application/json, text/event-stream"},
        json={"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "probe", "version": "1"}}}, timeout=60)


def log_in(served: Served, person: str = "") -> tuple[Memory, Person]:
    """The SDK's whole flow up to a tool call; the tokens it ends with."""
    storage = Memory()
    who = Person(served.base, served.api.token, person=person)
    result = call(served.base, provider(served.base, storage, who), "status", {})
    assert not result.is_error, text(result)
    assert storage.tokens is not None and storage.tokens.refresh_token
    return storage, who


# -- the tests -------------------------------------------------------------------

def test_the_runtimes_401_on_mcp_names_the_protected_resource_metadata(served: Served) -> None:
    api = served.api
    refused = mcp_status(api.base, "not-a-token")
    assert refused.status_code == 401
    challenge = refused.headers["www-authenticate"]
    assert challenge.startswith("Bearer ")
    assert f'resource_metadata="{api.base}/.well-known/oauth-protected-resource/mcp"' in challenge
    meta = httpx2.get(f"{api.base}/.well-known/oauth-protected-resource/mcp", timeout=60).json()
    assert meta["resource"] == f"{api.base}/mcp"
    server = meta["authorization_servers"][0].rstrip("/")
    assert server == api.base
    root = httpx2.get(f"{api.base}/.well-known/oauth-protected-resource", timeout=60).json()
    assert root == meta
    auth = httpx2.get(f"{api.base}/.well-known/oauth-authorization-server", timeout=60).json()
    assert auth["code_challenge_methods_supported"] == ["S256"]
    assert auth["token_endpoint_auth_methods_supported"] == ["client_secret_post"]
    assert auth["registration_endpoint"] == f"{api.base}/register"
    assert auth["revocation_endpoint"] == f"{api.base}/revoke"
    assert set(auth["grant_types_supported"]) >= {"authorization_code", "refresh_token"}
    # the admin token still opens /mcp, and nothing else of the API opened up
    assert mcp_status(api.base, api.token).status_code == 200
    assert httpx2.get(f"{api.base}/v1/status", timeout=60).status_code == 401


def test_discovery_registration_approval_and_a_tool_call_end_to_end(served: Served) -> None:
    storage, who = log_in(served, person="Ana")
    page = who.seen[0]
    assert "Home Assistant" in page and REDIRECT in page and "csrf" in page
    # the token works on /mcp; the file keeps only hashes, owner-only
    assert storage.tokens is not None
    access, refresh = storage.tokens.access_token, storage.tokens.refresh_token or ""
    assert mcp_status(served.base, access).status_code == 200
    kept = served.data / STORE_FILE
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    raw = kept.read_text()
    assert access not in raw and refresh not in raw
    assert hashlib.sha256(access.encode()).hexdigest() in raw
    # the access token opens nothing but /mcp
    assert httpx2.get(f"{served.base}/v1/status", timeout=60,
                      headers={"Authorization": f"Bearer {access}"}).status_code == 401


def test_an_expired_access_token_gets_401_and_a_refresh_works(served: Served) -> None:
    storage, who = log_in(served)
    assert storage.tokens is not None
    old = storage.tokens
    served.clock.advance(served.api.settings.http.mcp_access_token_seconds + 1)
    assert mcp_status(served.base, old.access_token).status_code == 401
    # the refresh as Home Assistant's OAuth2 session does it (its own client, by
    # expires_in): POST /token with the refresh token and the client's secret
    assert storage.client is not None
    secret = {"client_id": storage.client.client_id,
              "client_secret": storage.client.client_secret}
    answer = httpx2.post(f"{served.base}/token", timeout=60, data={
        "grant_type": "refresh_token", "refresh_token": old.refresh_token, **secret})
    assert answer.status_code == 200, answer.text
    fresh = OAuthToken.model_validate(answer.json())
    assert fresh.access_token != old.access_token and fresh.refresh_token != old.refresh_token
    assert fresh.expires_in == served.api.settings.http.mcp_access_token_seconds
    # the SDK's client goes on with the new token, no new approval asked for
    storage.tokens = fresh
    seen = len(who.seen)
    result = call(served.base, provider(served.base, storage, who), "status", {})
    assert not result.is_error, text(result)
    assert len(who.seen) == seen
    assert mcp_status(served.base, fresh.access_token).status_code == 200
    # the old refresh token was rotated away
    reused = httpx2.post(f"{served.base}/token", timeout=60, data={
        "grant_type": "refresh_token", "refresh_token": old.refresh_token, **secret})
    assert reused.status_code == 400 and reused.json()["error"] == "invalid_grant"
    # and a refresh token outlives its access token, not its own life
    served.clock.advance(served.api.settings.http.mcp_refresh_token_seconds + 1)
    late = httpx2.post(f"{served.base}/token", timeout=60, data={
        "grant_type": "refresh_token", "refresh_token": fresh.refresh_token, **secret})
    assert late.status_code == 400 and late.json()["error"] == "invalid_grant"


def test_a_revoked_token_gets_401(served: Served) -> None:
    storage, _ = log_in(served)
    assert storage.tokens is not None and storage.client is not None
    access = storage.tokens.access_token
    assert mcp_status(served.base, access).status_code == 200
    revoked = httpx2.post(f"{served.base}/revoke", timeout=60, data={
        "token": storage.tokens.refresh_token, "client_id": storage.client.client_id,
        "client_secret": storage.client.client_secret})
    assert revoked.status_code == 200, revoked.text
    # revoking the refresh token revokes its grant: the access token too
    assert mcp_status(served.base, access).status_code == 401
    refreshed = httpx2.post(f"{served.base}/token", timeout=60, data={
        "grant_type": "refresh_token", "refresh_token": storage.tokens.refresh_token,
        "client_id": storage.client.client_id,
        "client_secret": storage.client.client_secret})
    assert refreshed.status_code == 400


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(
        hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")
    return verifier, challenge


def test_pkce_with_a_wrong_verifier_is_refused(served: Served) -> None:
    base = served.base
    # registered and authorized as Home Assistant's own code does it
    # (homeassistant/components/mcp/registration.py and config_flow.py)
    client = httpx2.post(f"{base}/register", timeout=60, json={
        "redirect_uris": [REDIRECT], "client_name": "Home Assistant",
        "grant_types": ["authorization_code", "refresh_token"], "response_types": ["code"],
        "token_endpoint_auth_method": "client_secret_basic", "scope": "memory",
        "application_type": "web"}).json()
    assert client["client_secret"] and client["client_secret_expires_at"] == 0
    assert REDIRECT in client["redirect_uris"] and client["scope"] == "memory"
    # the secret goes in the form, as Home Assistant's OAuth2 implementation sends it
    assert client["token_endpoint_auth_method"] == "client_secret_post"
    verifier, challenge = pkce()

    async def code() -> str:
        who = Person(base, served.api.token)
        query = {"response_type": "code", "client_id": client["client_id"],
                 "redirect_uri": REDIRECT, "code_challenge": challenge,
                 "code_challenge_method": "S256", "state": "s1",
                 "access_type": "offline", "prompt": "consent", "scope": "memory"}
        from urllib.parse import urlencode
        await who.approve(f"{base}/authorize?{urlencode(query)}")
        assert who.result is not None and who.result.state == "s1"
        return who.result.code

    given = anyio.run(code)
    form = {"grant_type": "authorization_code", "code": given, "redirect_uri": REDIRECT,
            "client_id": client["client_id"], "client_secret": client["client_secret"]}
    wrong = httpx2.post(f"{base}/token", timeout=60,
                        data={**form, "code_verifier": pkce()[0]})
    assert wrong.status_code == 400 and wrong.json()["error"] == "invalid_grant", wrong.text
    right = httpx2.post(f"{base}/token", timeout=60,
                        data={**form, "code_verifier": verifier})
    assert right.status_code == 200, right.text
    assert right.json()["token_type"].lower() == "bearer"
    # a code is used once
    again = httpx2.post(f"{base}/token", timeout=60,
                        data={**form, "code_verifier": verifier})
    assert again.status_code == 400
    # plain PKCE is not accepted at /authorize
    plain = httpx2.get(f"{base}/authorize", timeout=60, params={
        "response_type": "code", "client_id": client["client_id"], "redirect_uri": REDIRECT,
        "code_challenge": verifier, "code_challenge_method": "plain", "state": "s2"})
    assert plain.status_code in (302, 303, 400)
    if plain.status_code != 400:
        assert "error=invalid_request" in plain.headers["location"]


def test_a_denied_approval_gives_no_code(served: Served) -> None:
    storage = Memory()
    who = Person(served.base, served.api.token, decision="deny")

    async def go() -> None:
        async with connected(served.base, provider(served.base, storage, who)) as client:
            await client.call_tool("status", {})

    with pytest.raises(Exception):  # noqa: B017 (the SDK's flow fails in its own way)
        anyio.run(go)
    assert storage.tokens is None


def test_an_oauth_caller_gets_no_other_persons_sensitive_memory(served: Served) -> None:
    backend = ActorBackend(served.api.settings)
    ana_ref, _ = backend.remember(ANA_SECRET, sensitive=True, person="Ana")
    ben_ref, _ = backend.remember(BEN_SECRET, sensitive=True, person="Ben")
    bearer = {"Authorization": f"Bearer {served.api.token}"}

    class Admin(httpx2.Auth):
        def auth_flow(self, request: Any) -> Any:
            request.headers.update(bearer)
            yield request

    def refs(auth: Any, tool: str, arguments: dict[str, Any]) -> set[str]:
        result = call(served.base, auth, tool, arguments)
        assert not result.is_error, text(result)
        return {m["ref"] for m in result.structured_content["memories"]}

    query = {"query": "Ana bank card PIN Ben insulin dose", "limit": 20}
    window = {"since": "today", "limit": 100}
    # the admin token sees everything
    assert wait_for(lambda: {ana_ref, ben_ref} <= refs(Admin(), "recall", query),
                    timeout=60), "both memories recalled"
    assert {ana_ref, ben_ref} <= refs(Admin(), "timeline", window)
    # a client Ana approved: her own sensitive memory, never Ben's
    storage, _ = log_in(served, person="Ana")
    ana = provider(served.base, storage, Person(served.base, served.api.token))
    recalled = call(served.base, ana, "recall", query)
    assert ana_ref in {m["ref"] for m in recalled.structured_content["memories"]}
    assert ben_ref not in {m["ref"] for m in recalled.structured_content["memories"]}
    assert "12 units" not in text(recalled)
    listed = call(served.base, ana, "timeline", window)
    assert ana_ref in text(listed) and ben_ref not in text(listed)
    assert "12 units" not in text(listed)
    # a client approved for the household: no person's sensitive memory
    storage, _ = log_in(served)
    house = provider(served.base, storage, Person(served.base, served.api.token))
    assert not {ana_ref, ben_ref} & refs(house, "recall", query)
    assert not {ana_ref, ben_ref} & refs(house, "timeline", window)
    # ... and forgets only what it may be told: Ben's memory is "not there" for
    # Ana's client, as a memory that does not exist is, and stays
    refused = call(served.base, ana, "forget", {"ref": ben_ref})
    missing = call(served.base, ana, "forget", {"ref": "fact:999999"})
    kind, number = ben_ref.split(":")
    assert refused.is_error and text(refused) == f"forget {ben_ref}: no {kind} {number}"
    assert missing.is_error and text(missing) == "forget fact:999999: no fact 999999"
    assert backend.get(ben_ref).text == BEN_SECRET
    forgot = call(served.base, ana, "forget", {"ref": ana_ref})
    assert not forgot.is_error, text(forgot)


def test_the_approval_form_needs_the_login_and_its_csrf_token(served: Served) -> None:
    base = served.base
    client = httpx2.post(f"{base}/register", timeout=60, json={
        "redirect_uris": [REDIRECT], "client_name": "csrf probe",
        "token_endpoint_auth_method": "client_secret_post"}).json()
    _, challenge = pkce()
    asked = httpx2.get(f"{base}/authorize", timeout=60, params={
        "response_type": "code", "client_id": client["client_id"], "redirect_uri": REDIRECT,
        "code_challenge": challenge, "code_challenge_method": "S256", "state": "s"})
    approval = asked.headers["location"]
    key = parse_qs(urlsplit(approval).query)["request"][0]
    with httpx2.Client(base_url=base, timeout=60) as browser:
        # not logged in: refused, no code
        bare = browser.post("/oauth/approve", data={"request": key, "decision": "approve"})
        assert bare.status_code == 401 and "location" not in bare.headers
        browser.post("/login", data={"token": served.api.token})
        page = browser.get(approval)
        assert page.status_code == 200
        forged = browser.post("/oauth/approve", data={
            "csrf": "forged", "request": key, "decision": "approve"})
        assert forged.status_code == 403 and "location" not in forged.headers
        # the request is still there for the real form
        real = browser.post("/oauth/approve", data={
            "csrf": field_of(page.text, "csrf"), "request": key, "decision": "approve"})
        assert real.status_code == 303 and "code=" in real.headers["location"]
        # and is used once
        again = browser.post("/oauth/approve", data={
            "csrf": field_of(page.text, "csrf"), "request": key, "decision": "approve"})
        assert again.status_code == 400


def test_the_memory_page_lists_connected_apps_and_disconnects_one(served: Served) -> None:
    storage, _ = log_in(served, person="Ben")
    assert storage.tokens is not None
    access = storage.tokens.access_token
    with httpx2.Client(base_url=served.base, timeout=60) as browser:
        assert browser.get("/oauth/apps").status_code == 303  # behind the login
        browser.post("/login", data={"token": served.api.token})
        listed = browser.get("/oauth/apps")
        assert listed.status_code == 200 and "approved for Ben" in listed.text
        grants = re.findall(r'name="grant" value="([^"]*)"', listed.text)
        csrf = field_of(listed.text, "csrf")
        forged = browser.post("/oauth/apps/disconnect", data={"csrf": "x", "grant": grants[-1]})
        assert forged.status_code == 403
        assert mcp_status(served.base, access).status_code == 200
        for grant in grants:
            gone = browser.post("/oauth/apps/disconnect", data={"csrf": csrf, "grant": grant})
            assert gone.status_code == 303
        assert "approved for Ben" not in browser.get("/oauth/apps").text
    assert mcp_status(served.base, access).status_code == 401


def test_a_host_header_that_is_no_host_does_not_reach_the_metadata(served: Served) -> None:
    port = urlsplit(served.base).port
    for bad in ['evil" , resource_metadata="http://attacker', "a b", "x/y"]:
        r = httpx2.post(f"{served.base}/mcp", headers={"Host": bad}, json={}, timeout=60)
        assert r.status_code == 401
        assert r.headers["www-authenticate"].endswith(
            f'resource_metadata="http://127.0.0.1:{port}/.well-known/'
            'oauth-protected-resource/mcp"'), r.headers["www-authenticate"]
    named = httpx2.get(f"{served.base}/.well-known/oauth-authorization-server",
                       headers={"Host": f"hub.lan:{port}"}, timeout=60).json()
    assert named["token_endpoint"] == f"http://hub.lan:{port}/token"


def test_an_unreadable_store_is_kept_aside_and_lets_nobody_in(tmp_path: Path) -> None:
    """Without the runtime: the store's file as the HTTP actor reads it at start."""
    from actors.http.oauth import OAuthStore

    clock = ManualClock(time.time())
    path = tmp_path / STORE_FILE
    store = OAuthStore(path, clock, 3600, 86400)
    issued = store.issue("client", ["memory"], "Ana", None)
    assert store.token(issued.access, "access") is not None
    again = OAuthStore(path, clock, 3600, 86400)  # a restart keeps the grant
    assert again.token(issued.access, "access") is not None
    assert again.token(issued.access, "refresh") is None  # kinds do not mix
    path.write_text("{ not json")
    broken = OAuthStore(path, clock, 3600, 86400)
    assert broken.token(issued.access, "access") is None
    assert (tmp_path / "mcp-oauth.broken").read_text() == "{ not json"  # nothing lost
