"""The memory page: a small web page at ``/`` for the household to see what the
assistant remembers, search it, disable, enable, pin, unpin and delete it, read
the timeline and look at the pictures (``/viz/*.png``).

Plain server-rendered HTML with a little inline JavaScript and CSS (no build
step, nothing from a CDN: the hub may be offline). Every value put into the
HTML goes through :func:`html.escape` (the templates are ``string.Template``s
filled by :func:`fill`, which escapes whatever is not already :class:`Safe`):
memory text is untrusted. Each response also carries a Content-Security-Policy
that runs only the page's own script and style (a per-response nonce), so even
a missed escape could not run injected script.

Who may look (enforced by :class:`actors.http.app.Guard`, with
:class:`PageAuth` from here): the same secret as the API. The login form
(``/login``) takes the token from ``<data dir>/http-token``; the server then
sets the session cookie ``reverie_session`` (HttpOnly, SameSite=Strict,
Path=/, Secure when served over https) whose value is
HMAC-SHA256(token, "reverie memory page: session"), never the token itself. It
is checked in constant time on every page request; a new token (the file
changed and the server restarted, as for the bearer token) makes every cookie
void. The cookie carries no expiry: it lasts as long as the browser session.
Logging out clears it in that browser (the value is derived, not stored: to
void it everywhere, change the token). Without a valid cookie (or bearer
token) a page GET is redirected (303) to ``/login`` and anything else is 401.

Changes (disable, enable, delete, pin, unpin) are POST forms. Each carries a
CSRF token, HMAC-SHA256(token, "reverie memory page: csrf|" + cookie), in a
hidden field, checked in constant time: 403 without it or with a wrong one. A
POST whose ``Origin`` (or, without one, ``Referer``) names another host:port
than the request's ``Host``, or that the browser marks ``Sec-Fetch-Site:
cross-site``, is refused (403) too, logging in and out included (those two are
open otherwise: logging in needs the token, logging out only clears the
cookie).
Deleting asks first: a JavaScript ``confirm``, and without JavaScript the
server answers the first press with a confirmation form.

Data comes from :class:`actors.http.backend.Backend` (browse, get, change); the
pictures from :func:`runtime.memories.viz.render` over a read-only store. Nothing here
logs memory text or the token.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import logging
import re
import secrets
from collections.abc import Callable, Iterable, Mapping
from datetime import date, datetime, time, timedelta, tzinfo
from string import Template
from typing import Any, TypeVar
from urllib.parse import parse_qs, quote, urlencode, urlsplit

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from actors.http.backend import Backend
from actors.http.oauth import OAUTH_KEY
from actors.messages import MAX_TURN_CHARS, BrowseMemories, MemoryPage, MemoryView
from runtime.config import Settings
from runtime.memories.privacy import person_key
from runtime.recall.excerpt import excerpt
from runtime.time.clock import household_zone

log = logging.getLogger(__name__)

COOKIE = "reverie_session"
SCOPE_KEY = "reverie.page_auth"   # where Guard leaves the PageAuth for the page's routes
PAGE_SIZE = 25
# In the list and the timeline a longer turn shows its stretch of this many
# tokens that holds the most of the search words (the start without a search),
# as recall injects it (runtime.recall.excerpt); its ref opens it whole.
EXCERPT_TOKENS = 100
TIMELINE_DAYS = 7                 # the timeline's default range: the last week
KINDS = ("turn", "episode", "fact")
ACTIONS = ("disable", "enable", "delete", "pin", "unpin")
PICTURES = {"map": "The memory map", "timeline": "The timeline",
            "decay": "How memories fade"}

# The page's paths: the only ones a session cookie opens (the API's stay
# bearer-only). The login form and logging out are open.
PAGE_PATHS = frozenset({"/", "/login", "/logout", "/timeline", "/pictures",
                        "/oauth/approve", "/oauth/apps", "/oauth/apps/disconnect"})
PAGE_PREFIXES = ("/memories/", "/viz/")
OPEN_PATHS = frozenset({"/login", "/logout"})

T = TypeVar("T")


def is_page_path(path: str) -> bool:
    return path in PAGE_PATHS or path.startswith(PAGE_PREFIXES)


def is_open_path(path: str) -> bool:
    return path in OPEN_PATHS


# -- the session cookie and the CSRF token ------------------------------------------

def _mac(key: bytes, message: str) -> str:
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


class PageAuth:
    """The page's secrets, all derived from the API token: the session cookie's
    value and the CSRF token. Every check is in constant time."""

    def __init__(self, token: str) -> None:
        key = token.encode()
        self._token = key
        self.cookie = _mac(key, "reverie memory page: session")
        self.csrf = _mac(key, "reverie memory page: csrf|" + self.cookie)

    def token_ok(self, given: str) -> bool:
        return bool(given) and hmac.compare_digest(given.strip().encode(), self._token)

    def cookie_ok(self, cookie_header: bytes | str | None) -> bool:
        # every cookie of the name: the hub's login (path /) comes along with a
        # household's (path /households/ID), in an order the browser picks
        found = False
        for given in cookie_values(cookie_header, COOKIE):
            found |= hmac.compare_digest(given.encode(), self.cookie.encode())
        return found

    def csrf_ok(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.csrf.encode())


def cookie_values(header: bytes | str | None, name: str) -> list[str]:
    """The values of cookie ``name`` in a ``Cookie`` header (none: not there)."""
    if not header:
        return []
    text = header.decode("latin-1") if isinstance(header, bytes) else header
    found = []
    for part in text.split(";"):
        key, sep, value = part.strip().partition("=")
        if sep and key == name:
            found.append(value.strip().strip('"'))
    return found


_OWN_URL = re.compile(r'(\s(?:href|action|src)=")/(?!/)')


def rooted(text: str, root: str) -> str:
    """A page's HTML served under ``root`` (a household's ``/households/ID``):
    each link, form and image of its own (``href``, ``action``, ``src`` that
    start with one ``/``) put under it. What a memory says cannot match: its
    quotes are escaped (:func:`esc`)."""
    return _OWN_URL.sub(lambda m: m.group(1) + root + "/", text) if root else text


def same_origin(headers: Mapping[str, str]) -> bool:
    """Whether a state-changing request comes from this site: ``Origin`` (or,
    without one, ``Referer``) names the ``Host`` it was sent to, and the browser
    does not call it cross-site. Neither header: allowed (not a browser's
    cross-site form; the CSRF token still has to match)."""
    if headers.get("sec-fetch-site", "").lower() == "cross-site":
        return False
    host = headers.get("host", "").lower()
    origin = headers.get("origin")
    if origin is not None:
        return origin != "null" and bool(host) and urlsplit(origin).netloc.lower() == host
    referer = headers.get("referer")
    if referer:
        return bool(host) and urlsplit(referer).netloc.lower() == host
    return True


def local_path(value: str | None, default: str = "/") -> str:
    """``value`` when it is a path of this page (where to go after an action),
    else ``default``: never another site (``//host``), never the API."""
    if not value or not value.startswith("/") or value.startswith("//"):
        return default
    if "\\" in value or any(ord(c) < 0x21 or c == "\x7f" for c in value):
        return default
    return value if is_page_path(urlsplit(value).path) else default


# -- dates in the household's zone --------------------------------------------------

def day_range(first: date, last: date, zone: tzinfo) -> tuple[float, float]:
    """``[since, until)`` in epoch seconds covering the local days ``first`` to
    ``last`` (both included) in ``zone``."""
    start = datetime.combine(first, time(0), tzinfo=zone)
    end = datetime.combine(last + timedelta(days=1), time(0), tzinfo=zone)
    return start.timestamp(), end.timestamp()


def _parse_day(value: str | None) -> date | None:
    """A ``YYYY-MM-DD`` date from a form (None: empty, unreadable or absurd)."""
    if not value:
        return None
    try:
        day = date.fromisoformat(value.strip())
    except ValueError:
        return None
    return day if 1900 <= day.year <= 9000 else None


def _kinds(kind: str) -> list[Any]:
    """The kinds to browse: ``kind``, or all of them for ""."""
    return [kind] if kind in KINDS else list(KINDS)


def _when(stamp: float, zone: tzinfo) -> str:
    return datetime.fromtimestamp(stamp, tz=zone).strftime("%Y-%m-%d %H:%M")


# -- HTML ---------------------------------------------------------------------------

class Safe(str):
    """HTML already escaped (or written here): :func:`fill` puts it in as is."""


def esc(value: object) -> str:
    return value if isinstance(value, Safe) else html.escape(str(value), quote=True)


def fill(template: str, **values: object) -> Safe:
    """``template`` (a ``string.Template``) with every value escaped unless Safe."""
    return Safe(Template(template).substitute({k: esc(v) for k, v in values.items()}))


def join(parts: Iterable[Safe]) -> Safe:
    return Safe("".join(parts))


def _ref_path(ref: str) -> str:
    return "/memories/" + quote(ref, safe=":")


STYLE = """
:root { color-scheme: light dark; --line: #8884; --muted: #777; --accent: #2b6cb0; }
* { box-sizing: border-box; }
body { font: 16px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 56rem;
       padding: 0 1rem 3rem; }
header { display: flex; flex-wrap: wrap; align-items: center; gap: .5rem 1.25rem;
         border-bottom: 1px solid var(--line); padding: .75rem 0; margin-bottom: 1rem; }
header .brand { font-weight: 700; margin-right: auto; }
header a { color: inherit; }
nav a[aria-current] { font-weight: 700; }
h1 { font-size: 1.4rem; }
form.inline { display: inline; margin: 0; }
form.filters { display: flex; flex-wrap: wrap; gap: .5rem; align-items: end; margin-bottom: 1rem; }
label { display: flex; flex-direction: column; font-size: .85rem; color: var(--muted); }
input, select, button { font: inherit; padding: .3rem .5rem; }
input[type=search] { min-width: 16rem; }
button { cursor: pointer; border: 1px solid var(--line); border-radius: .3rem;
         background: none; color: inherit; }
button.danger { color: #c53030; }
ol.memories { list-style: none; padding: 0; margin: 0; }
li.memory { border: 1px solid var(--line); border-radius: .4rem; padding: .6rem .8rem;
            margin: .5rem 0; }
li.memory.disabled .text { opacity: .55; text-decoration: line-through; }
.meta { font-size: .85rem; color: var(--muted); display: flex; flex-wrap: wrap; gap: .25rem .6rem; }
.text { margin: .35rem 0; white-space: pre-wrap; overflow-wrap: anywhere; }
.badge { border: 1px solid var(--line); border-radius: 1rem; padding: 0 .45rem; font-size: .8rem; }
.badge.pinned { border-color: var(--accent); color: var(--accent); }
.actions { display: flex; flex-wrap: wrap; gap: .4rem; }
.pager { display: flex; gap: 1rem; align-items: center; margin-top: 1rem; }
.notice { border-left: 4px solid #c53030; padding: .5rem .8rem; }
.day h2 { font-size: 1.05rem; margin: 1.2rem 0 .3rem; }
figure { margin: 1rem 0; }
figure img { max-width: 100%; height: auto; border: 1px solid var(--line); }
table.details { border-collapse: collapse; font-size: .9rem; }
table.details td, table.details th { border-bottom: 1px solid var(--line); padding: .2rem .6rem;
  text-align: left; vertical-align: top; }
.muted { color: var(--muted); }
"""

# Delete asks first: with JavaScript, a confirm(); the answer goes along as
# confirmed=yes. Without it the server asks with a form of its own.
SCRIPT = """
document.addEventListener("submit", function (event) {
  var form = event.target;
  var question = form.getAttribute("data-confirm");
  if (!question) { return; }
  if (!window.confirm(question)) { event.preventDefault(); return; }
  var field = form.querySelector("input[name=confirmed]");
  if (field) { field.value = "yes"; }
});
"""

LAYOUT = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="same-origin">
<link rel="icon" href="data:,">
<title>$title · Reverie</title>
<style nonce="$nonce">$style</style>
</head>
<body>
<header><span class="brand">Reverie · what the assistant remembers</span>$nav</header>
<main>
<h1>$title</h1>
$body
</main>
<script nonce="$nonce">$script</script>
</body>
</html>
"""

NAV = """<nav>
<a href="/" $on_list>Memories</a> ·
<a href="/timeline" $on_timeline>Timeline</a> ·
<a href="/pictures" $on_pictures>Pictures</a> ·
<a href="/oauth/apps" $on_apps>Connected apps</a>
</nav>
<form class="inline" method="post" action="/logout">
<button type="submit" id="logout">Log out</button>
</form>"""

LOGIN = """<p>Paste the access token to see the memories. It is in the file
<code>http-token</code> in Reverie's data directory (for example
<code>~/.local/share/reverie/http-token</code>).</p>
$problem
<form method="post" action="/login" id="login">
<input type="hidden" name="next" value="$next">
<label>Access token <input type="password" name="token" id="token" required
 autocomplete="current-password" autofocus></label>
<p><button type="submit">Log in</button></p>
</form>"""

FILTERS = """<form class="filters" method="get" action="$action" id="filters">
$fields
<label>Kind <select name="kind" id="kind">$kinds</select></label>
<button type="submit" id="search">Show</button>
</form>"""

WORDS = """<label>Words (all must match)
<input type="search" name="q" id="q" value="$q" maxlength="$maxlength"></label>"""

DATES = """<label>From <input type="date" name="from" id="from" value="$first"></label>
<label>To <input type="date" name="to" id="to" value="$last"></label>"""

ITEM = """<li class="memory$classes" data-ref="$ref" id="$anchor">
<div class="meta"><a href="$href">$ref</a><span>$kind</span>
<time datetime="$iso">$when</time>$badges</div>
<p class="text">$text</p>
<div class="actions">$actions</div>
</li>"""

ACTION = """<form class="inline" method="post" action="$href/$action"$confirm>
<input type="hidden" name="csrf" value="$csrf">
<input type="hidden" name="back" value="$back">$extra
<button type="submit" data-action="$action"$danger>$label</button>
</form>"""

CONFIRM_DELETE = """<p>Delete this memory for good? It cannot be brought back
(to only hide it from the assistant, disable it instead).</p>
$item
<form method="post" action="$href/delete" id="confirm-delete">
<input type="hidden" name="csrf" value="$csrf">
<input type="hidden" name="back" value="$back">
<input type="hidden" name="confirmed" value="yes">
<button type="submit" class="danger" data-action="confirm-delete">Delete for good</button>
<a href="$back">Cancel</a>
</form>"""

ASK_DELETE = "Delete this memory for good? It cannot be brought back."

APPS = """<p>Apps that use Reverie's memory through MCP with your approval (Home
Assistant, for one). Disconnecting one voids its tokens at once; it has to be
approved again to come back. A client using the access token itself is not
listed here: it sees everything.</p>
$listing"""

APP = """<li class="app"><strong>$name</strong>, approved for $person, until $until
<form class="inline" method="post" action="/oauth/apps/disconnect">
<input type="hidden" name="csrf" value="$csrf">
<input type="hidden" name="grant" value="$grant">
<button type="submit" class="danger" data-action="disconnect">Disconnect</button>
</form></li>"""

APPROVE = """<p><strong id="client">$client</strong> asks to use Reverie's memory
through MCP (<code>/mcp</code>).</p>
<p>It gets the memory tools: recall and timeline (read what is remembered),
remember (add a fact), forget (delete a memory) and status. It never gets
another person's sensitive memories (codes, health, money): only those of the
person named below, and the household's.</p>
<p>After you decide, your browser goes back to <code id="redirect">$redirect</code>.
Only approve if you just started connecting it.</p>
<form method="post" action="/oauth/approve" id="approve">
<input type="hidden" name="csrf" value="$csrf">
<input type="hidden" name="request" value="$request">
<label>Who is approving <select name="person" id="person">$people</select></label>
<p><button type="submit" name="decision" value="approve" id="allow">Approve</button>
<button type="submit" name="decision" value="deny" id="deny">Deny</button></p>
</form>"""


def security_headers(nonce: str) -> dict[str, str]:
    return {
        "Content-Security-Policy": (
            f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
            "img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; "
            "base-uri 'none'"),
        "X-Frame-Options": "DENY",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "same-origin",
        "Cache-Control": "no-store",
    }


# -- the routes -----------------------------------------------------------------------

def install(app: Any, settings: Settings, backend: Backend) -> None:
    """Add the memory page's routes to the FastAPI app (Guard lets a session
    cookie through on :func:`is_page_path` paths only)."""
    zone = household_zone(settings.household.timezone)

    def auth_of(request: Request) -> PageAuth:
        found = request.scope.get(SCOPE_KEY)
        if not isinstance(found, PageAuth):  # the app runs without its Guard
            raise RuntimeError("the memory page needs actors.http.app.Guard in front")
        return found

    def page(request: Request, title: str, body: Safe, status: int = 200,
             current: str = "", logged_in: bool = True) -> HTMLResponse:
        nonce = secrets.token_urlsafe(16)
        nav = Safe("")
        if logged_in:
            marks = {f"on_{name}": Safe('aria-current="page"' if current == name else "")
                     for name in ("list", "timeline", "pictures", "apps")}
            nav = fill(NAV, **marks)
        text = rooted(fill(LAYOUT, title=title, nonce=nonce, style=Safe(STYLE), nav=nav,
                           body=body, script=Safe(SCRIPT)), request.scope.get("root_path", ""))
        return HTMLResponse(text, status_code=status, headers=security_headers(nonce))

    def trouble(request: Request, exc: BaseException) -> HTMLResponse:
        if isinstance(exc, ValueError):  # BadRequest, a bad ref, a refused change
            from runtime.memories.refs import NoSuchItem

            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            body = fill('<p class="notice" id="problem">$message</p><p><a href="/">Back to '
                        'the memories</a></p>', message=first)
            if isinstance(exc, NoSuchItem):
                return page(request, "No such memory", body, status=404)
            return page(request, "That did not work", body, status=400)
        log.warning("memory page: %s %s failed: %s", request.method, request.url.path,
                    type(exc).__name__)
        body = fill('<p class="notice" id="problem">The runtime could not answer ($kind); '
                    'see <code>reverie status</code>.</p>', kind=type(exc).__name__)
        return page(request, "Not available", body, status=503)

    async def call(fn: Callable[..., T], *args: Any) -> T:
        return await run_in_threadpool(fn, *args)

    async def form_of(request: Request) -> dict[str, str]:
        """The url-encoded form (Guard has read and size-checked the body)."""
        if not request.headers.get("content-type", "").startswith(
                "application/x-www-form-urlencoded"):
            return {}
        raw = (await request.body()).decode("utf-8", "replace")
        return {k: v[0] for k, v in parse_qs(raw, keep_blank_values=True).items()}

    def refused(request: Request, why: str) -> HTMLResponse:
        log.warning("memory page: refused %s %s (%s)", request.method, request.url.path, why)
        body = fill('<p class="notice" id="problem">$why</p><p><a href="/">Back to the '
                    'memories</a></p>', why=why)
        return page(request, "Refused", body, status=403, logged_in=False)

    async def checked_form(request: Request) -> dict[str, str] | Response:
        """The form of a change, or the refusal: it must come from this site
        and carry this login's CSRF token."""
        if not same_origin(request.headers):
            return refused(request, "This form was sent from another site.")
        form = await form_of(request)
        if not auth_of(request).csrf_ok(form.get("csrf")):
            return refused(request, "This form is stale or was not sent by this page; "
                                    "reload the page and try again.")
        return form

    def here(request: Request) -> str:
        query = request.url.query
        return request.url.path + (f"?{query}" if query else "")

    # -- rendering pieces

    def item_html(request: Request, item: MemoryView, back: str, actions: bool = True,
                  words: str | None = None) -> Safe:
        """One memory; with ``words`` (a list's search words, "" for none) a long
        turn as its excerpt (:data:`EXCERPT_TOKENS`)."""
        csrf = auth_of(request).csrf
        text = item.text
        if words is not None and item.kind == "turn":
            text = excerpt(text, words, EXCERPT_TOKENS)
        href = _ref_path(item.ref)
        badges = []
        if item.disabled:
            badges.append(Safe('<span class="badge disabled">disabled</span>'))
        if item.pinned:
            badges.append(Safe('<span class="badge pinned">pinned</span>'))
        if item.sensitive:
            badges.append(Safe('<span class="badge sensitive">sensitive</span>'))
        for label in (item.level, item.speaker, item.channel):
            if label:
                badges.append(fill('<span class="badge">$label</span>', label=label))
        buttons: list[Safe] = []
        if actions:
            wanted = ["enable" if item.disabled else "disable"]
            if item.kind != "turn":  # a turn has no level to pin
                wanted.append("unpin" if item.pinned else "pin")
            wanted.append("delete")
            for action in wanted:
                delete = action == "delete"
                buttons.append(fill(
                    ACTION, href=href, action=action, csrf=csrf, back=back,
                    label=action.capitalize(),
                    confirm=Safe(f' data-confirm="{esc(ASK_DELETE)}"' if delete else ""),
                    extra=Safe('\n<input type="hidden" name="confirmed" value="">'
                               if delete else ""),
                    danger=Safe(' class="danger"' if delete else "")))
        classes = ("" if not item.disabled else " disabled") + (" pinned" if item.pinned else "")
        moment = datetime.fromtimestamp(item.created_at, tz=zone)
        return fill(ITEM, classes=classes, ref=item.ref, anchor="m-" + item.ref.replace(":", "-"),
                    href=href, kind=item.kind, iso=moment.isoformat(timespec="seconds"),
                    when=_when(item.created_at, zone), badges=join(badges), text=text,
                    actions=join(buttons))

    def kind_options(kind: str) -> Safe:
        options = [("", "all kinds")] + [(k, k + "s") for k in KINDS]
        return join(fill('<option value="$value"$selected>$label</option>', value=value,
                         label=label, selected=Safe(" selected" if value == kind else ""))
                    for value, label in options)

    def pager(path: str, params: dict[str, str], page_no: int, total: int) -> Safe:
        pages = max(1, -(-total // PAGE_SIZE))
        links: list[Safe] = []

        def link(label: str, number: int, rel: str) -> Safe:
            query = urlencode({k: v for k, v in {**params, "page": str(number)}.items() if v})
            return fill('<a href="$href" rel="$rel" id="$rel">$label</a>',
                        href=f"{path}?{query}", rel=rel, label=label)

        if page_no > 1:
            links.append(link("Previous page", page_no - 1, "prev"))
        links.append(fill('<span id="pages">page $n of $of · $total $noun</span>',
                          n=page_no, of=pages, total=total,
                          noun="memory" if total == 1 else "memories"))
        if page_no < pages:
            links.append(link("Next page", page_no + 1, "next"))
        return fill('<div class="pager">$links</div>', links=join(links))

    def page_number(request: Request) -> int:
        raw = request.query_params.get("page", "1")
        return int(raw) if raw.isascii() and raw.isdigit() and 0 < int(raw) < 10_000 else 1

    def wanted_kind(request: Request) -> str:
        kind = request.query_params.get("kind", "")
        return kind if kind in KINDS else ""

    def words(request: Request) -> str:
        return request.query_params.get("q", "").strip()[:MAX_TURN_CHARS]

    # -- log in, log out

    def login_form(request: Request, problem: str = "", status: int = 200,
                   back: str = "/") -> HTMLResponse:
        note = fill('<p class="notice" id="problem">$p</p>', p=problem) if problem else Safe("")
        return page(request, "Log in", fill(LOGIN, problem=note, next=back), status=status,
                    logged_in=False)

    @app.get("/login", include_in_schema=False)
    def login_page(request: Request) -> HTMLResponse:
        return login_form(request, back=local_path(request.query_params.get("next")))

    @app.post("/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        if not same_origin(request.headers):
            return refused(request, "This form was sent from another site.")
        auth = auth_of(request)
        form = await form_of(request)
        back = local_path(form.get("next"))
        if not auth.token_ok(form.get("token", "")):
            log.warning("memory page: a login with a wrong token")
            return login_form(request, "That is not the token.", status=401, back=back)
        response = RedirectResponse(back, status_code=303)
        response.set_cookie(COOKIE, auth.cookie, path="/", httponly=True, samesite="strict",
                            secure=request.url.scheme == "https")
        response.headers["Cache-Control"] = "no-store"
        return response

    @app.post("/logout", include_in_schema=False)
    async def logout(request: Request) -> Response:
        if not same_origin(request.headers):
            return refused(request, "This form was sent from another site.")
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict",
                               secure=request.url.scheme == "https")
        return response

    # -- browsing

    async def listing(request: Request, msg: BrowseMemories) -> MemoryPage | HTMLResponse:
        try:
            return await call(backend.browse, msg)
        except Exception as exc:  # shown as a page, not a traceback
            return trouble(request, exc)

    @app.get("/", include_in_schema=False)
    async def memories(request: Request) -> HTMLResponse:
        q, kind, page_no = words(request), wanted_kind(request), page_number(request)
        found = await listing(request, BrowseMemories(
            kinds=_kinds(kind), text=q or None,
            limit=PAGE_SIZE, offset=(page_no - 1) * PAGE_SIZE))
        if isinstance(found, HTMLResponse):
            return found
        back = here(request)
        items = join(item_html(request, item, back, words=q) for item in found.items)
        if not found.items:
            items = Safe('<p class="muted" id="empty">Nothing found.</p>')
        else:
            items = fill('<ol class="memories" id="memories">$items</ol>', items=items)
        body = join([
            fill(FILTERS, action="/", kinds=kind_options(kind),
                 fields=fill(WORDS, q=q, maxlength=MAX_TURN_CHARS)),
            items, pager("/", {"q": q, "kind": kind}, page_no, found.total)])
        return page(request, "Memories", body, current="list")

    @app.get("/timeline", include_in_schema=False)
    async def timeline(request: Request) -> HTMLResponse:
        today = datetime.now(tz=zone).date()
        params = request.query_params
        first = _parse_day(params.get("from")) or today - timedelta(days=TIMELINE_DAYS - 1)
        last = _parse_day(params.get("to")) or today
        if last < first:
            first, last = last, first
        kind, page_no = wanted_kind(request), page_number(request)
        since, until = day_range(first, last, zone)
        found = await listing(request, BrowseMemories(
            kinds=_kinds(kind), since=since, until=until,
            oldest_first=True, limit=PAGE_SIZE, offset=(page_no - 1) * PAGE_SIZE))
        if isinstance(found, HTMLResponse):
            return found
        back = here(request)
        days: dict[date, list[Safe]] = {}
        for item in found.items:
            day = datetime.fromtimestamp(item.created_at, tz=zone).date()
            days.setdefault(day, []).append(item_html(request, item, back, words=""))
        sections = join(
            fill('<section class="day" data-day="$day"><h2>$label</h2>'
                 '<ol class="memories">$items</ol></section>',
                 day=day.isoformat(), label=day.strftime("%A %d %B %Y"), items=join(shown))
            for day, shown in days.items())
        if not found.items:
            sections = Safe('<p class="muted" id="empty">Nothing remembered in these days.</p>')
        dates = fill(DATES, first=first.isoformat(), last=last.isoformat())
        body = join([
            fill(FILTERS, action="/timeline", fields=dates, kinds=kind_options(kind)),
            fill('<p class="muted">Days in $zone, oldest first.</p>', zone=str(zone)),
            sections,
            pager("/timeline", {"from": first.isoformat(), "to": last.isoformat(),
                                "kind": kind}, page_no, found.total)])
        return page(request, "Timeline", body, current="timeline")

    @app.get("/pictures", include_in_schema=False)
    def pictures(request: Request) -> HTMLResponse:
        figures = join(
            fill('<figure><img src="/viz/$name.png" alt="$caption" id="viz-$name" '
                 'loading="lazy"><figcaption>$caption</figcaption></figure>',
                 name=name, caption=caption)
            for name, caption in PICTURES.items())
        return page(request, "Pictures", figures, current="pictures")

    @app.get("/memories/{ref}", include_in_schema=False)
    async def one(request: Request, ref: str) -> HTMLResponse:
        try:
            item = await call(backend.get, ref)
        except Exception as exc:
            return trouble(request, exc)
        rows = join(fill("<tr><th>$key</th><td>$value</td></tr>", key=k, value=v)
                    for k, v in sorted(item.details.items()))
        if item.source:
            rows = join([fill("<tr><th>source</th><td>$v</td></tr>", v=item.source), rows])
        body = join([
            fill('<ol class="memories">$item</ol>',
                 item=item_html(request, item, _ref_path(item.ref))),
            fill('<table class="details" id="details">$rows</table>', rows=rows),
            Safe('<p><a href="/">Back to the memories</a></p>')])
        return page(request, item.ref, body)

    # -- changes

    @app.post("/memories/{ref}/{action}", include_in_schema=False)
    async def act(request: Request, ref: str, action: str) -> Response:
        form = await checked_form(request)
        if isinstance(form, Response):
            return form
        if action not in ACTIONS:
            return trouble(request, ValueError(f"unknown change {action!r}"))
        back = local_path(form.get("back"))
        if action == "delete" and form.get("confirmed") != "yes":
            try:
                item = await call(backend.get, ref)
            except Exception as exc:
                return trouble(request, exc)
            body = fill(CONFIRM_DELETE, item=fill(
                '<ol class="memories">$i</ol>',
                i=item_html(request, item, back, actions=False)),
                href=_ref_path(item.ref), csrf=auth_of(request).csrf, back=back)
            return page(request, "Delete this memory?", body)
        try:
            await call(backend.change, ref, action)
        except Exception as exc:
            return trouble(request, exc)
        log.info("memory page: %s %s", action, ref)
        if action == "delete" and urlsplit(back).path == _ref_path(ref):
            back = "/"
        return RedirectResponse(back, status_code=303)

    # -- approving an MCP client (OAuth, actors.http.oauth)

    def oauth_of(request: Request) -> Any:
        found = request.scope.get(OAUTH_KEY)
        if found is None:
            raise RuntimeError("OAuth needs actors.http.app.Guard in front")
        return found

    def gone(request: Request) -> HTMLResponse:
        body = Safe('<p class="notice" id="problem">This request to connect is unknown or '
                    'has expired; start connecting again from the app.</p>')
        return page(request, "Nothing to approve", body, status=400)

    @app.get("/oauth/approve", include_in_schema=False)
    def approve_page(request: Request) -> HTMLResponse:
        key = request.query_params.get("request", "")
        pending = oauth_of(request).store.pending(key)
        if pending is None:
            return gone(request)
        options = [Safe('<option value="">the household (no one person)</option>')]
        options += [fill('<option value="$p">$p</option>', p=person)
                    for person in settings.household.people]
        body = fill(APPROVE, client=pending.client_name or "An unnamed app",
                    redirect=pending.redirect_uri, csrf=auth_of(request).csrf, request=key,
                    people=join(options))
        response = page(request, "Connect an app?", body)
        # the form's answer redirects to the app: CSP form-action must allow it
        target = urlsplit(pending.redirect_uri)
        csp = response.headers["Content-Security-Policy"].replace(
            "form-action 'self'", f"form-action 'self' {target.scheme}://{target.netloc}")
        response.headers["Content-Security-Policy"] = csp
        return response

    @app.get("/oauth/apps", include_in_schema=False)
    def apps_page(request: Request) -> HTMLResponse:
        rows = [fill(APP, name=name, person=person or "the household",
                     until=_when(until, zone), grant=grant, csrf=auth_of(request).csrf)
                for grant, name, person, until in oauth_of(request).store.grants()]
        listing = (fill('<ul class="apps" id="apps">$rows</ul>', rows=join(rows)) if rows
                   else Safe('<p id="apps">No app is connected.</p>'))
        body = fill(APPS, listing=listing)
        return page(request, "Connected apps", body, current="apps")

    @app.post("/oauth/apps/disconnect", include_in_schema=False)
    async def disconnect(request: Request) -> Response:
        form = await checked_form(request)
        if isinstance(form, Response):
            return form
        if oauth_of(request).store.revoke(form.get("grant", ""), grant=True):
            log.info("memory page: an app was disconnected")
        return RedirectResponse("/oauth/apps", status_code=303)

    @app.post("/oauth/approve", include_in_schema=False)
    async def approve(request: Request) -> Response:
        from mcp.server.auth.provider import construct_redirect_uri

        form = await checked_form(request)
        if isinstance(form, Response):
            return form
        person = form.get("person", "").strip() or None
        if person is not None and person_key(person) not in {
                person_key(p) for p in settings.household.people}:
            return trouble(request, ValueError(f"{person!r} is not one of the household's "
                                               "people (household.people)"))
        store = oauth_of(request).store
        pending = store.decide(form.get("request", ""))
        if pending is None:
            return gone(request)
        if form.get("decision") != "approve":
            log.info("memory page: an app's request to connect was denied")
            where = construct_redirect_uri(pending.redirect_uri, error="access_denied",
                                           state=pending.state)
        else:
            log.info("memory page: an app was approved to connect")
            where = construct_redirect_uri(pending.redirect_uri,
                                           code=store.new_code(pending, person),
                                           state=pending.state)
        return RedirectResponse(where, status_code=303, headers={"Cache-Control": "no-store"})

    @app.get("/viz/{name}.png", include_in_schema=False)
    async def picture(request: Request, name: str) -> Response:
        if name not in PICTURES:
            return Response("no such picture", status_code=404, media_type="text/plain")
        try:
            png = await call(render_picture, name, settings)
        except PicturesUnavailable as exc:
            return Response(str(exc), status_code=503, media_type="text/plain",
                            headers={"Cache-Control": "no-store"})
        except Exception as exc:
            log.warning("memory page: picture %s failed: %s", name, type(exc).__name__)
            return Response(f"the picture could not be drawn ({type(exc).__name__})",
                            status_code=503, media_type="text/plain",
                            headers={"Cache-Control": "no-store"})
        return Response(png, media_type="image/png",
                        headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})


class PicturesUnavailable(RuntimeError):
    """The pictures cannot be drawn here (no database yet, no matplotlib)."""


def render_picture(name: str, settings: Settings) -> bytes:
    """One picture (PNG bytes) of the memory store, drawn by :mod:`runtime.memories.viz`
    over a read-only connection opened for this picture alone (WAL: it never
    blocks the runtime's writers)."""
    try:
        from runtime.memories import viz
    except ImportError as exc:
        raise PicturesUnavailable("the pictures are not available here "
                                  f"({type(exc).__name__})") from exc
    try:
        store = viz.open_read_only(settings)
    except ValueError as exc:
        raise PicturesUnavailable("there is no memory database to draw yet") from exc
    with store:
        return viz.render(name, store, settings)
