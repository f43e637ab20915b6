"""The memory page (actors/http/page.py) and its way past the Guard.

Two halves:

- the app over an in-memory backend (no Ray, no browser): the cookie and CSRF
  rules, what the Guard lets through where, escaping, the household's days;
- the real runtime (the actors on the test session's Ray) in a real headless
  Chromium (tests/browser.py): log in through the form, browse, search, press
  the buttons and check the change through REST, the timeline, the pictures,
  hostile memory text, cross-site posts. It leaves a screenshot in
  ``test-artifacts/memory-page.png`` (or ``$REVERIE_TEST_ARTIFACTS``).
"""

from __future__ import annotations

import http.client
import json
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit
from zoneinfo import ZoneInfo

import pytest
from fastapi.testclient import TestClient
from http_runtime import http_runtime

from actors.http.app import make_app
from actors.http.page import (
    COOKIE,
    PageAuth,
    cookie_values,
    day_range,
    local_path,
    rooted,
    same_origin,
)
from actors.messages import BrowseMemories, MemoryPage, MemoryView
from runtime.config import Settings, load_settings
from runtime.memories.refs import NoSuchItem
from tests import browser
from tests.browser import WAIT_S, artifacts_dir

chromium = browser.chromium  # the module's headless Chromium (a fixture)

NS = "test-http-page"
ZONE = "Pacific/Kiritimati"  # UTC+14: the household's days are not UTC's
TOKEN = "the-token-" + "x" * 32
HOSTILE = ('<script>window.__pwned = 1</script> Zebra crossing '
           '<img src="x" onerror="window.__pwned = 2"> & "quotes" \'too\'')


# -- an in-memory backend ---------------------------------------------------------

@dataclass
class FakeBackend:
    items: list[MemoryView] = field(default_factory=list)
    asked: list[BrowseMemories] = field(default_factory=list)
    changes: list[tuple[str, str]] = field(default_factory=list)
    fail: BaseException | None = None

    def add(self, text: str, kind: str = "fact", when: float | None = None,
            **extra: Any) -> MemoryView:
        item = MemoryView(ref=f"{kind}:{len(self.items) + 1}", kind=kind,  # type: ignore[arg-type]
                          item_id=len(self.items) + 1, text=text,
                          created_at=time.time() if when is None else when,
                          disabled=False, **extra)
        self.items.append(item)
        return item

    def browse(self, msg: BrowseMemories) -> MemoryPage:
        self.asked.append(msg)
        if self.fail is not None:
            raise self.fail
        words = (msg.text or "").lower().split()
        found = [i for i in self.items if i.kind in msg.kinds
                 and all(w in i.text.lower() for w in words)
                 and (msg.since is None or i.created_at >= msg.since)
                 and (msg.until is None or i.created_at < msg.until)]
        found.sort(key=lambda i: i.created_at, reverse=not msg.oldest_first)
        return MemoryPage(items=found[msg.offset:msg.offset + msg.limit], total=len(found))

    def get(self, ref: str) -> MemoryView:
        for item in self.items:
            if item.ref == ref:
                return item
        raise NoSuchItem(f"no {ref}")

    def change(self, ref: str, change: str) -> str:
        self.changes.append((ref, change))
        item = self.get(ref)
        at = self.items.index(item)
        if change == "delete":
            del self.items[at]
        elif change in ("disable", "enable"):
            self.items[at] = item.model_copy(update={"disabled": change == "disable"})
        else:
            self.items[at] = item.model_copy(update={"pinned": change == "pin"})
        return change


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[tuple[TestClient, FakeBackend, Settings]]:
    settings = load_settings(env={}, overrides={
        "store": {"data_dir": str(tmp_path / "data")}, "household": {"timezone": ZONE},
        "http": {"port": 0, "max_body_bytes": 4096}})
    backend = FakeBackend()
    app = make_app(settings, TOKEN, backend)  # type: ignore[arg-type]
    with TestClient(app, follow_redirects=False) as client:
        yield client, backend, settings


def logged_in(client: TestClient) -> str:
    """Log ``client`` in through the form; the CSRF token the page's buttons then
    carry (there must be a memory to show), or the expected one if none."""
    r = client.post("/login", data={"token": TOKEN})
    assert r.status_code == 303 and r.headers["location"] == "/", r.text
    page = client.get("/").text
    return csrf_of(page) if 'name="csrf"' in page else PageAuth(TOKEN).csrf


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, page
    return found.group(1)


# -- the pieces ----------------------------------------------------------------------

def test_the_cookie_and_csrf_token_derive_from_the_token_and_are_neither() -> None:
    auth, other = PageAuth(TOKEN), PageAuth(TOKEN + "2")
    assert TOKEN not in auth.cookie and TOKEN not in auth.csrf
    assert auth.cookie != auth.csrf and auth.cookie != other.cookie
    assert auth.token_ok(f"  {TOKEN}\n") and not auth.token_ok("") and not auth.token_ok("x")
    assert auth.cookie_ok(f"a=1; {COOKIE}={auth.cookie}; b=2")
    assert not auth.cookie_ok(f"{COOKIE}={other.cookie}") and not auth.cookie_ok(None)
    assert not auth.cookie_ok(f"x{COOKIE}={auth.cookie}")
    assert auth.csrf_ok(auth.csrf) and not auth.csrf_ok(other.csrf)
    assert not auth.csrf_ok(None) and not auth.csrf_ok("")
    assert cookie_values(b"a=1;b=2", "b") == ["2"] and cookie_values("a", "a") == []
    # the hub's login and a household's both come along: either one opening is enough
    assert auth.cookie_ok(f"{COOKIE}={other.cookie}; {COOKIE}={auth.cookie}")
    assert auth.cookie_ok(f"{COOKIE}={auth.cookie}; {COOKIE}={other.cookie}")
    assert not auth.cookie_ok(f"{COOKIE}={other.cookie}; {COOKIE}=x")


def test_a_page_served_under_a_path_links_under_it() -> None:
    page = ('<a href="/">M</a><form action="/logout"></form><img src="/viz/map.png">'
            '<a href="//elsewhere/">x</a><a href="https://a.example/">y</a>'
            '<input name="back" value="/timeline">')
    assert rooted(page, "/households/alpha") == (
        '<a href="/households/alpha/">M</a><form action="/households/alpha/logout"></form>'
        '<img src="/households/alpha/viz/map.png"><a href="//elsewhere/">x</a>'
        '<a href="https://a.example/">y</a><input name="back" value="/timeline">')
    assert rooted(page, "") == page


@pytest.mark.parametrize("headers,ok", [
    ({"host": "hub:8765"}, True),                                     # no Origin, no Referer
    ({"host": "hub:8765", "origin": "http://hub:8765"}, True),
    ({"host": "hub:8765", "origin": "http://HUB:8765"}, True),
    ({"host": "hub:8765", "origin": "http://evil.example"}, False),
    ({"host": "hub:8765", "origin": "http://hub:8123"}, False),       # another port: another site
    ({"host": "hub:8765", "origin": "null"}, False),
    ({"host": "hub:8765", "origin": "http://evil@hub:8765"}, False),
    ({"host": "hub:8765", "referer": "http://hub:8765/?q=x"}, True),
    ({"host": "hub:8765", "referer": "http://evil.example/hub:8765"}, False),
    ({"host": "hub:8765", "origin": "http://hub:8765", "sec-fetch-site": "cross-site"}, False),
    ({"origin": "http://hub:8765"}, False),                           # no Host to compare
])
def test_same_origin(headers: dict[str, str], ok: bool) -> None:
    assert same_origin(headers) is ok


@pytest.mark.parametrize("back,to", [
    ("/?q=boiler&page=2", "/?q=boiler&page=2"),
    ("/timeline?from=2024-01-01", "/timeline?from=2024-01-01"),
    ("/memories/fact:3", "/memories/fact:3"), (None, "/"), ("", "/"),
    ("//evil.example/", "/"), ("http://evil.example/", "/"), ("/\\evil.example", "/"),
    ("/v1/status", "/"), ("/mcp", "/"), ("/\r\nSet-Cookie: x=1", "/"), ("memories", "/"),
])
def test_where_an_action_goes_back_to_is_this_page_only(back: str | None, to: str) -> None:
    assert local_path(back) == to


def test_days_are_the_households() -> None:
    since, until = day_range(date(2024, 3, 10), date(2024, 3, 11), ZoneInfo(ZONE))
    assert datetime.fromtimestamp(since, ZoneInfo("UTC")).isoformat() == \
        "2024-03-09T10:00:00+00:00"
    assert until - since == 2 * 86400
    lisbon = ZoneInfo("Europe/Lisbon")  # a day with a clock change is 23 hours long
    since, until = day_range(date(2024, 3, 31), date(2024, 3, 31), lisbon)
    assert until - since == 23 * 3600


# -- the app over the in-memory backend ----------------------------------------------

PAGE_GETS = ["/", "/timeline", "/pictures", "/memories/fact:1", "/viz/map.png"]


@pytest.mark.parametrize("path", PAGE_GETS)
def test_not_logged_in_a_page_sends_to_the_login_form(fake: Any, path: str) -> None:
    client, backend, _ = fake
    r = client.get(path)
    assert r.status_code == 303 and r.headers["location"] == "/login"
    assert not backend.asked
    client.cookies.set(COOKIE, PageAuth("an-older-token").cookie)  # the token changed
    assert client.get(path).status_code == 303
    login = client.get("/login")
    assert login.status_code == 200 and 'name="token"' in login.text


@pytest.mark.parametrize("path", ["/memories/fact:1/disable", "/memories/fact:1/delete"])
def test_not_logged_in_a_post_is_401(fake: Any, path: str) -> None:
    client, backend, _ = fake
    backend.add("The boiler is in the attic.")
    r = client.post(path, data={"csrf": PageAuth(TOKEN).csrf, "confirmed": "yes"})
    assert r.status_code == 401 and not backend.changes


@pytest.mark.parametrize("method,path", [
    ("GET", "/v1/status"), ("GET", "/v1/memories"), ("POST", "/v1/memories/fact:1/disable"),
    ("GET", "/openapi.json"), ("POST", "/mcp"), ("GET", "/api/tags"), ("GET", "/v1/models"),
    ("GET", "/memories"), ("GET", "/loginx"),
])
def test_the_cookie_opens_only_the_page(fake: Any, method: str, path: str) -> None:
    client, _, _ = fake
    logged_in(client)
    r = client.request(method, path)
    assert r.status_code == 401, (path, r.text)
    # /mcp's 401 also names its OAuth metadata (RFC 9728): still no cookie login there
    assert r.headers["www-authenticate"].split(",")[0] == (
        'Bearer error="invalid_token"' if path == "/mcp" else "Bearer"), (path, r.text)


def test_log_in_sets_a_strict_httponly_session_cookie_not_the_token(fake: Any) -> None:
    client, backend, _ = fake
    backend.add("The spare key is under the blue pot.")
    r = client.post("/login", data={"token": TOKEN})
    assert r.status_code == 303 and r.headers["location"] == "/"
    cookie = r.headers["set-cookie"]
    flags = [f.strip().lower() for f in cookie.split(";")]
    assert "httponly" in flags and "samesite=strict" in flags and "path=/" in flags
    assert TOKEN not in cookie
    page = client.get("/")
    assert page.status_code == 200 and "The spare key is under the blue pot." in page.text
    # a bearer client may look too, without the cookie
    client.cookies.clear()
    assert client.get("/").status_code == 303
    bearer = client.get("/", headers={"Authorization": f"Bearer {TOKEN}"})
    assert bearer.status_code == 200


def test_a_wrong_token_is_refused_and_sets_nothing(fake: Any) -> None:
    client, _, _ = fake
    for wrong in ("", "wrong", TOKEN + "x", TOKEN[:-1]):
        r = client.post("/login", data={"token": wrong})
        assert r.status_code == 401 and "set-cookie" not in r.headers
        assert "That is not the token." in r.text
        assert wrong not in re.findall(r'value="([^"]*)"', r.text)  # not echoed back
    assert client.get("/").status_code == 303


def test_log_in_from_another_site_is_refused(fake: Any) -> None:
    client, _, _ = fake
    r = client.post("/login", data={"token": TOKEN}, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403 and "set-cookie" not in r.headers


def test_log_out_clears_the_cookie(fake: Any) -> None:
    client, _, _ = fake
    logged_in(client)
    r = client.post("/logout")
    assert r.status_code == 303 and r.headers["location"] == "/login"
    assert f'{COOKIE}=""' in r.headers["set-cookie"] and "Max-Age=0" in r.headers["set-cookie"]
    assert client.get("/").status_code == 303


def test_every_change_needs_the_csrf_token_and_this_site(fake: Any) -> None:
    client, backend, _ = fake
    item = backend.add("The boiler is in the attic.")
    csrf = logged_in(client)
    url = f"/memories/{item.ref}/disable"
    for data, headers in [
        ({}, {}),                                                         # no token
        ({"csrf": ""}, {}),
        ({"csrf": PageAuth("another-token").csrf}, {}),                   # a wrong one
        ({"csrf": PageAuth(TOKEN).cookie}, {}),                           # the cookie is not it
        ({"csrf": csrf}, {"Origin": "http://evil.example"}),              # another site
        ({"csrf": csrf}, {"Referer": "http://evil.example/page"}),
        ({"csrf": csrf}, {"Origin": "null"}),
        ({"csrf": csrf}, {"Sec-Fetch-Site": "cross-site"}),
    ]:
        r = client.post(url, data=data, headers=headers)
        assert r.status_code == 403, (data, headers, r.text)
    # the token as JSON or multipart is not a form this page reads
    assert client.post(url, json={"csrf": csrf}).status_code == 403
    assert client.post(url, files={"csrf": (None, csrf)}).status_code == 403
    assert not backend.changes and not backend.get(item.ref).disabled
    ok = client.post(url, data={"csrf": csrf, "back": "/?q=boiler"},
                     headers={"Origin": "http://testserver"})
    assert ok.status_code == 303 and ok.headers["location"] == "/?q=boiler"
    assert backend.changes == [(item.ref, "disable")] and backend.get(item.ref).disabled


@pytest.mark.parametrize("action", ["disable", "enable", "pin", "unpin"])
def test_each_button_changes_its_memory(fake: Any, action: str) -> None:
    client, backend, _ = fake
    item = backend.add("The boiler is in the attic.", level="vivid")
    csrf = logged_in(client)
    r = client.post(f"/memories/{item.ref}/{action}", data={"csrf": csrf})
    assert r.status_code == 303 and backend.changes == [(item.ref, action)]


def test_delete_asks_first_without_javascript(fake: Any) -> None:
    client, backend, _ = fake
    item = backend.add("The boiler is in the attic.")
    csrf = logged_in(client)
    asked = client.post(f"/memories/{item.ref}/delete", data={"csrf": csrf, "back": "/"})
    assert asked.status_code == 200 and 'id="confirm-delete"' in asked.text
    assert "The boiler is in the attic." in asked.text and not backend.changes
    assert csrf_of(asked.text) == csrf and 'name="confirmed" value="yes"' in asked.text
    done = client.post(f"/memories/{item.ref}/delete",
                       data={"csrf": csrf, "back": f"/memories/{item.ref}", "confirmed": "yes"})
    assert done.status_code == 303 and done.headers["location"] == "/"  # not the gone item
    assert backend.changes == [(item.ref, "delete")] and not backend.items


def test_unknown_changes_and_memories_are_clean_pages(fake: Any) -> None:
    client, backend, _ = fake
    csrf = logged_in(client)
    r = client.post("/memories/fact:9/disable", data={"csrf": csrf})
    assert r.status_code == 404 and "no fact:9" in r.text
    assert client.get("/memories/fact:9").status_code == 404
    assert client.post("/memories/fact:9/explode", data={"csrf": csrf}).status_code == 400
    backend.fail = NotImplementedError()
    down = client.get("/")
    assert down.status_code == 503 and "NotImplementedError" in down.text
    assert down.headers["content-type"].startswith("text/html")


def test_memory_text_is_escaped_everywhere(fake: Any) -> None:
    client, backend, _ = fake
    item = backend.add(HOSTILE, speaker="<b>eve</b>", channel='"><script>x()</script>',
                       details={"<i>key</i>": "<script>y()</script>"})
    logged_in(client)
    for path in ("/", f"/memories/{item.ref}", "/timeline", "/?q=zebra+crossing"):
        text = client.get(path).text
        assert "Zebra crossing" in text, path
        assert "<script>window" not in text and "<img src=\"x\"" not in text, path
        assert "<b>eve" not in text and "<script>x()" not in text and "<i>key" not in text, path
        assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in text, path
        assert text.count("<script") == 1  # the page's own, with its nonce
    q = client.get("/", params={"q": '"><script>z()</script>'}).text
    assert "<script>z()" not in q and 'value="&quot;&gt;&lt;script&gt;z()' in q


def test_search_words_kind_and_paging_reach_the_backend(fake: Any) -> None:
    client, backend, _ = fake
    for n in range(30):
        backend.add(f"Reminder number {n} about the bins.", when=1_700_000_000.0 + n)
    backend.add("The bins go out on Thursday.", kind="episode")
    logged_in(client)
    odd = '"NEAR( AND * OR -x:y ^'
    r = client.get("/", params={"q": odd})
    assert r.status_code == 200 and backend.asked[-1].text == odd
    assert 'id="empty"' in r.text
    first = client.get("/", params={"q": "bins reminder"}).text
    assert backend.asked[-1].text == "bins reminder" and backend.asked[-1].offset == 0
    assert "page 1 of 2 · 30 memories" in first and 'rel="next"' in first
    assert "Reminder number 29 " in first and "Thursday" not in first
    second = client.get("/", params={"q": "bins reminder", "page": "2"}).text
    assert backend.asked[-1].offset == 25 and "Reminder number 0 " in second
    assert 'rel="prev"' in second and 'rel="next"' not in second
    only = client.get("/", params={"kind": "episode"}).text
    assert backend.asked[-1].kinds == ["episode"] and "Thursday" in only
    assert "Reminder" not in only
    assert client.get("/", params={"kind": "bogus", "page": "-3"}).status_code == 200
    assert backend.asked[-1].kinds == ["turn", "episode", "fact"]
    assert backend.asked[-1].offset == 0


def test_a_long_turn_is_listed_as_its_excerpt_and_opened_whole(fake: Any) -> None:
    """Issue 25: the list shows a long turn as the stretch that holds the search
    words, with its ref, which opens the whole turn."""
    client, backend, _ = fake
    filler = "We talked about many other things that afternoon, none of them important. "
    text = filler * 20 + "The spare key hangs behind the pantry door. " + filler * 20
    item = backend.add(text, kind="turn")
    logged_in(client)
    listed = client.get("/", params={"q": "pantry key"}).text
    assert "The spare key hangs behind the pantry door." in listed
    assert "\u2026" in listed and listed.count("none of them important") < 10
    assert f'data-ref="{item.ref}"' in listed
    whole = client.get(f"/memories/{item.ref}").text
    assert whole.count("none of them important") == 40


def test_the_timeline_reads_days_in_the_households_zone(fake: Any) -> None:
    client, backend, _ = fake
    zone = ZoneInfo(ZONE)
    inside = datetime(2024, 3, 10, 0, 30, tzinfo=zone).timestamp()   # 2024-03-09 10:30 UTC
    before = datetime(2024, 3, 9, 23, 30, tzinfo=zone).timestamp()
    backend.add("Inside the range.", when=inside)
    backend.add("Before the range.", when=before)
    logged_in(client)
    r = client.get("/timeline", params={"from": "2024-03-10", "to": "2024-03-10"})
    assert r.status_code == 200
    asked = backend.asked[-1]
    assert (asked.since, asked.until) == day_range(date(2024, 3, 10), date(2024, 3, 10), zone)
    assert asked.oldest_first
    assert "Inside the range." in r.text and "Before the range." not in r.text
    assert 'data-day="2024-03-10"' in r.text and "2024-03-10 00:30" in r.text
    # reversed or unreadable dates do not break it
    swapped = client.get("/timeline", params={"from": "2024-03-11", "to": "2024-03-09"})
    assert swapped.status_code == 200
    assert client.get("/timeline", params={"from": "soon", "to": "<x>"}).status_code == 200
    assert client.get("/timeline", params={"from": "0001-01-01", "to": "9999-12-31"}).status_code \
        == 200


def test_pages_carry_a_strict_content_security_policy(fake: Any) -> None:
    client, _, _ = fake
    logged_in(client)
    for path in ("/", "/login", "/timeline", "/pictures"):
        r = client.get(path)
        csp = r.headers["content-security-policy"]
        nonce = re.search(r"'nonce-([^']+)'", csp)
        assert nonce and f'<script nonce="{nonce.group(1)}">' in r.text, path
        assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
        assert "unsafe-inline" not in csp
        assert r.headers["cache-control"] == "no-store" and r.headers["x-frame-options"] == "DENY"


def test_pictures_without_a_database_are_503_and_unknown_ones_404(fake: Any) -> None:
    client, _, _ = fake
    logged_in(client)
    assert client.get("/viz/map.png").status_code == 503  # nothing stored yet
    assert client.get("/viz/secrets.png").status_code == 404


# -- the real runtime in a real browser ---------------------------------------------------

@dataclass
class Runtime:
    settings: Settings
    base: str
    token: str

    def netloc(self) -> str:
        return urlsplit(self.base).netloc

    def call(self, method: str, path: str, body: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
        conn = http.client.HTTPConnection(self.netloc(), timeout=WAIT_S)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode()
        finally:
            conn.close()

    def rest(self, method: str, path: str, payload: Any = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.token}"}
        body = None
        if payload is not None:
            body = json.dumps(payload).encode()
            headers["Content-Type"] = "application/json"
        status, _, text = self.call(method, path, body, headers)
        return status, json.loads(text) if text else None

    def remember(self, text: str) -> str:
        status, wrote = self.rest("POST", "/v1/memories", {"text": text})
        assert status == 201, wrote
        return str(wrote["ref"])

    def memory(self, ref: str) -> dict[str, Any] | None:
        """The memory as REST shows it (None: there is none)."""
        status, found = self.rest("GET", f"/v1/memories/{ref}")
        if status == 404:
            return None
        assert status == 200, found
        return dict(found)

    def post_form(self, path: str, fields: dict[str, str],
                  headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
        return self.call("POST", path, urlencode(fields).encode(), {
            "Content-Type": "application/x-www-form-urlencoded", **(headers or {})})

    def session(self) -> str:
        """The session cookie, got through the login form (as a browser would)."""
        status, headers, _ = self.post_form("/login", {"token": self.token})
        assert status == 303, status
        value = cookie_values(headers["set-cookie"].split(";")[0], COOKIE)
        assert value
        return f"{COOKIE}={value[0]}"


@pytest.fixture(scope="module")
def runtime(ray_instance: str, tmp_path_factory: pytest.TempPathFactory,
            model_cache: Path) -> Iterator[Runtime]:
    with http_runtime(NS, tmp_path_factory.mktemp("http-page-data"), model_cache,
                      household={"timezone": ZONE}) as started:
        yield Runtime(started.settings, started.base, started.token)


def word() -> str:
    """A word no other memory has (letters only: one search term)."""
    return "zq" + "".join(chr(ord("a") + int(c, 16) % 26) for c in uuid.uuid4().hex[:10])


def wait(driver: Any, condition: Any) -> Any:
    """Until ``condition`` holds (a page that is being replaced is looked at again)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S, ignored_exceptions=[
        StaleElementReferenceException]).until(condition)


def ready(driver: Any) -> bool:
    """The document is whole (asked together with a sign of the new page, after a click)."""
    return bool(driver.execute_script("return document.readyState") == "complete")


def css(driver: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, selector))


def log_in(driver: Any, rt: Runtime, token: str | None = None) -> None:
    """Through the form, as a person would: paste the token, press the button."""
    driver.delete_all_cookies()
    driver.get(rt.base + "/login")
    field_ = wait(driver, lambda d: css(d, "#token") and css(d, "#token")[0])
    field_.send_keys(rt.token if token is None else token)
    css(driver, "#login button[type=submit]")[0].click()
    if token is None:
        wait(driver, lambda d: css(d, "#memories, #empty") and ready(d))


def row(driver: Any, ref: str) -> Any:
    found = css(driver, f'li.memory[data-ref="{ref}"]')
    return found[0] if found else None


def press(driver: Any, ref: str, action: str) -> None:
    css(driver, f'li.memory[data-ref="{ref}"] button[data-action="{action}"]')[0].click()


def show(driver: Any, rt: Runtime, q: str) -> None:
    driver.get(f"{rt.base}/?{urlencode({'q': q})}")
    wait(driver, lambda d: css(d, "#memories, #empty") and ready(d))


def test_browser_not_logged_in_goes_to_the_login_form(chromium: Any, runtime: Runtime) -> None:
    chromium.delete_all_cookies()
    for path in ("/", "/timeline", "/pictures"):
        chromium.get(runtime.base + path)
        wait(chromium, lambda d: urlsplit(d.current_url).path == "/login" and css(d, "#token"))


def test_browser_a_wrong_token_is_refused(chromium: Any, runtime: Runtime) -> None:
    log_in(chromium, runtime, token="not-the-token")
    problem = wait(chromium, lambda d: css(d, "#problem") and css(d, "#problem")[0])
    assert problem.text == "That is not the token."
    assert chromium.get_cookie(COOKIE) is None
    chromium.get(runtime.base + "/")
    wait(chromium, lambda d: urlsplit(d.current_url).path == "/login")


def test_browser_log_in_sets_a_strict_httponly_cookie(chromium: Any, runtime: Runtime) -> None:
    log_in(chromium, runtime)
    assert urlsplit(chromium.current_url).path == "/"
    cookie = chromium.get_cookie(COOKIE)
    assert cookie is not None
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
    assert cookie["path"] == "/" and runtime.token not in cookie["value"]
    assert chromium.execute_script("return document.cookie") == ""  # HttpOnly: no script sees it
    # the cookie opens the page, not the API
    status, _, _ = runtime.call("GET", "/v1/status",
                                headers={"Cookie": f"{COOKIE}={cookie['value']}"})
    assert status == 401
    css(chromium, "#logout")[0].click()
    wait(chromium, lambda d: urlsplit(d.current_url).path == "/login")
    assert chromium.get_cookie(COOKIE) is None


def test_browser_a_remembered_memory_appears_and_search_finds_only_it(
        chromium: Any, runtime: Runtime) -> None:
    violin, garage = word(), word()
    mine = runtime.remember(f"The {violin} violin lessons are on Tuesday afternoons.")
    other = runtime.remember(f"The {garage} garage door opener needs a new battery.")
    log_in(chromium, runtime)
    wait(chromium, lambda d: row(d, mine) and row(d, other))
    assert "violin lessons are on Tuesday" in row(chromium, mine).text

    css(chromium, "#q")[0].send_keys(f"{violin} tuesday")
    css(chromium, "#search")[0].click()
    wait(chromium, lambda d: "q=" in d.current_url and row(d, mine) and ready(d))
    assert row(chromium, other) is None
    assert css(chromium, "#q")[0].get_attribute("value") == f"{violin} tuesday"

    show(chromium, runtime, f"{violin} battery")  # every word must match
    assert row(chromium, mine) is None and row(chromium, other) is None
    for odd in ('"NEAR( AND *', "*", '") OR 1=1 --', "violin^ NOT(", "    "):
        show(chromium, runtime, odd)
        assert not css(chromium, "#problem"), odd

    chromium.get(f"{runtime.base}/?{urlencode({'kind': 'turn', 'q': violin})}")
    wait(chromium, lambda d: css(d, "#empty"))  # a fact is not a turn
    chromium.get(f"{runtime.base}/?{urlencode({'kind': 'fact', 'q': violin})}")
    wait(chromium, lambda d: row(d, mine))


def test_browser_buttons_disable_enable_pin_unpin_delete(chromium: Any, runtime: Runtime) -> None:
    marker = word()
    ref = runtime.remember(f"The {marker} water meter is behind the kitchen door.")
    log_in(chromium, runtime)
    show(chromium, runtime, marker)

    def state() -> dict[str, Any]:
        found = runtime.memory(ref)
        assert found is not None
        return found

    assert not state()["disabled"] and not state()["pinned"]
    press(chromium, ref, "disable")
    wait(chromium, lambda d: "disabled" in (row(d, ref).get_attribute("class") or "")
         and ready(d))
    assert state()["disabled"]
    assert "q=" in chromium.current_url  # back where it was
    press(chromium, ref, "enable")
    wait(chromium, lambda d: css(d, f'li.memory[data-ref="{ref}"] button[data-action=disable]')
         and ready(d))
    assert not state()["disabled"]
    press(chromium, ref, "pin")
    wait(chromium, lambda d: css(d, f'li.memory[data-ref="{ref}"] .badge.pinned') and ready(d))
    assert state()["pinned"]
    press(chromium, ref, "unpin")
    wait(chromium, lambda d: css(d, f'li.memory[data-ref="{ref}"] button[data-action=pin]')
         and ready(d))
    assert not state()["pinned"]

    from selenium.webdriver.support import expected_conditions as ec

    press(chromium, ref, "delete")  # asked, and said no
    alert = wait(chromium, ec.alert_is_present())
    assert "for good" in alert.text
    alert.dismiss()
    assert row(chromium, ref) is not None and runtime.memory(ref) is not None
    press(chromium, ref, "delete")  # asked, and said yes
    wait(chromium, ec.alert_is_present()).accept()
    wait(chromium, lambda d: css(d, "#empty") and ready(d))
    assert runtime.memory(ref) is None


def test_delete_without_javascript_asks_with_a_form(runtime: Runtime) -> None:
    ref = runtime.remember(f"The {word()} fuse box is in the hallway cupboard.")
    cookie = runtime.session()
    _, _, page = runtime.call("GET", "/", headers={"Cookie": cookie})
    csrf = csrf_of(page)
    status, _, asked = runtime.post_form(f"/memories/{ref}/delete", {"csrf": csrf, "back": "/"},
                                         {"Cookie": cookie})
    assert status == 200 and 'id="confirm-delete"' in asked and "fuse box" in asked
    assert runtime.memory(ref) is not None
    status, headers, _ = runtime.post_form(
        f"/memories/{ref}/delete", {"csrf": csrf, "back": "/", "confirmed": "yes"},
        {"Cookie": cookie, "Origin": runtime.base})
    assert status == 303 and headers["location"] == "/"
    assert runtime.memory(ref) is None


def test_cross_site_posts_are_refused_and_change_nothing(runtime: Runtime) -> None:
    ref = runtime.remember(f"The {word()} bike lock code is 0420.")
    cookie = runtime.session()
    _, _, page = runtime.call("GET", "/", headers={"Cookie": cookie})
    csrf = csrf_of(page)
    url = f"/memories/{ref}/disable"
    status, _, _ = runtime.post_form(url, {"csrf": csrf})  # no cookie
    assert status == 401
    for fields, headers in [
        ({}, {}),                                                     # no CSRF token
        ({"csrf": "0" * 64}, {}),                                     # a wrong one
        ({"csrf": csrf}, {"Origin": "http://evil.example"}),          # another site
        ({"csrf": csrf}, {"Origin": runtime.base.replace("127.0.0.1", "localhost")}),
        ({"csrf": csrf}, {"Referer": "http://evil.example/hub"}),
    ]:
        status, _, body = runtime.post_form(url, fields, {"Cookie": cookie, **headers})
        assert status == 403, (fields, headers, body)
        assert not runtime.memory(ref)["disabled"]  # type: ignore[index]
    # the same request from this site goes through: the refusals were not for nothing else
    status, _, _ = runtime.post_form(url, {"csrf": csrf},
                                     {"Cookie": cookie, "Origin": runtime.base})
    assert status == 303 and runtime.memory(ref)["disabled"]  # type: ignore[index]


def test_browser_hostile_memory_text_is_shown_as_text(chromium: Any, runtime: Runtime) -> None:
    marker = word()
    text = f"{marker} {HOSTILE}"
    ref = runtime.remember(text)
    log_in(chromium, runtime)
    for path in (f"/?{urlencode({'q': marker})}", f"/memories/{ref}"):
        chromium.get(runtime.base + path)
        wait(chromium, lambda d: row(d, ref) and ready(d))
        shown = css(chromium, f'li.memory[data-ref="{ref}"] .text')[0].text
        assert "<script>window.__pwned = 1</script>" in shown, shown
        assert '<img src="x" onerror="window.__pwned = 2">' in shown, shown
        assert not css(chromium, f'li.memory[data-ref="{ref}"] img, li.memory script')
        assert chromium.execute_script("return window.__pwned === undefined")


def test_browser_the_timeline_shows_todays_memory(chromium: Any, runtime: Runtime) -> None:
    marker = word()
    ref = runtime.remember(f"The {marker} chimney sweep comes at noon.")
    today = datetime.now(ZoneInfo(ZONE)).date().isoformat()
    log_in(chromium, runtime)
    css(chromium, 'nav a[href="/timeline"]')[0].click()
    wait(chromium, lambda d: row(d, ref) and ready(d))  # the default range ends today
    chromium.get(f"{runtime.base}/timeline?{urlencode({'from': today, 'to': today})}")
    wait(chromium, lambda d: row(d, ref))
    day = css(chromium, f'section.day:has(li.memory[data-ref="{ref}"])')[0]
    assert day.get_attribute("data-day") == today
    assert css(chromium, "#from")[0].get_attribute("value") == today
    chromium.save_screenshot(str(artifacts_dir() / "memory-page-timeline.png"))
    chromium.get(f"{runtime.base}/timeline?from=2001-01-01&to=2001-01-31")
    wait(chromium, lambda d: css(d, "#empty"))
    assert row(chromium, ref) is None


def test_browser_the_pictures_load(chromium: Any, runtime: Runtime) -> None:
    runtime.remember(f"The {word()} recycling goes out on Fridays.")
    log_in(chromium, runtime)
    css(chromium, 'nav a[href="/pictures"]')[0].click()
    wait(chromium, lambda d: len(css(d, "figure img")) == 3)
    sizes = wait(chromium, lambda d: d.execute_script(
        "var imgs = Array.from(document.querySelectorAll('figure img'));"
        "return imgs.every(function (i) { return i.complete; })"
        " ? imgs.map(function (i) { return [i.id, i.naturalWidth]; }) : null;"))
    assert {name for name, _ in sizes} == {"viz-map", "viz-timeline", "viz-decay"}
    assert all(width > 0 for _, width in sizes), sizes
    chromium.save_screenshot(str(artifacts_dir() / "memory-page-pictures.png"))


def test_browser_screenshot_of_the_memory_page(chromium: Any, runtime: Runtime) -> None:
    runtime.remember("Grandma's birthday is on the 14th of May; she likes tulips.")
    runtime.remember("The wifi password for guests is on the fridge.")
    log_in(chromium, runtime)
    out = artifacts_dir() / "memory-page.png"
    assert chromium.save_screenshot(str(out))
    assert out.stat().st_size > 0
