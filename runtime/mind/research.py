"""The ``research`` job: proactive research from the feeds the user chose.

At most once every ``research.every_s`` (6 hours by default), whatever the
Cron gate allows: the job keeps its last completed run's time in
``job_state`` (``research`` / ``last_run_at``) and ends ok with "not due"
before then. It reads each RSS (0.9x, 1.0, 2.0) or Atom feed of
``research.feeds`` and saves the items relevant to the household as
``discovery`` facts (they fade in about two weeks: ``configs/fact_kinds.toml``)
of source ``research``. Nothing is pushed to chat: no transcript turn.

**Fetching.** One HTTP(S) GET per feed with a conditional request: the ETag
and Last-Modified a feed last answered are kept in ``job_state`` (``feed
<hash of the URL>``) and sent back as If-None-Match / If-Modified-Since, so a
feed that has not changed answers 304 and costs nothing (no parse, no
embedding, no write). Every request has a timeout (``timeout_s`` on the
connection and on each read, and the same again as a deadline for the whole
body), a response is read to at most ``max_feed_bytes`` (the complete items
before the cut are kept, the run counts a truncated feed), and redirects go
to http(s) only. A feed that is down, slow, refused or malformed is counted
by reason in the run's detail (and in ``job_state`` ``last``) and skipped;
the other feeds still run.

**Parsing.** Feeds are untrusted input. They are parsed with the standard
library's XML parser behind defusedxml: entity declarations and external
references are refused (no "billion laughs", no reading local files), only
the first ``max_items_per_feed`` items of a feed are read, and each item's
text is bounded: HTML is reduced to plain text (scripts and styles dropped),
control and bidirectional-override characters go, and the text is cut
(``max_item_chars`` for scoring, ``excerpt_chars`` for what is stored). An
item without an http(s) link, or with neither title nor text, is skipped
and counted. Item text is data, never instructions: no language model reads
it here, and in the stored value it is quoted between « and » (removed from
the text itself, so the quote cannot be closed early).

**Interests.** What the household cares about, built from what memory holds
(:func:`interests`), each a text with a weight, deterministic:

- the portrait (the latest version the synthesis job wrote, less the lines
  whose sources are gone; else a current ``portrait`` fact), line by line:
  preferences, routines and current concerns weight 1, who they are and the
  people around them 0.5;
- current, enabled facts: ``behavioral_pattern`` facts and the user's
  preferences, plans and events (``user_specific`` facts keyed
  ``preference_*``, ``plan_*``, ``event_*``; dislikes left out), weight 1;
  DMN ``reflection`` facts, weight 0.7;
- episodes of the last 90 days (not hidden or rolled up), weight 0.7 times
  their recency (``exp(-age / 30 days)``);
- the user's own turns of the last 30 days (role ``user``, a source whose
  profile counts as user behaviour, four words or more), weight 0.5 times
  their recency.

Discoveries themselves are never interests, so the job cannot feed on itself.
With no interests yet the job ends ok without fetching anything.

**Scoring.** Each new item's title and text (``"<title>. <text>"``) is
embedded with the configured embedder; its score is the highest
``weight x cosine`` over the interests. Items scoring at least ``threshold``
are relevant; the best ``max_new_per_run`` of them (score, then key) are
written. The default threshold, 0.25, was chosen on a hand-made set for a
household that talks about gardening and cycling (the one
``tests/test_research.py`` builds: preference facts, a commute pattern, an
episode, and turns, everyday ones about timers and the weather among them),
each headline with a one-line summary: 12 relevant ones scored 0.206 to
0.597 (tomatoes in pots 0.60, gravel bikes 0.42, Tour de France 0.41,
composting 0.36, a planting calendar 0.33, roses 0.31, then bike helmets, a
flat tyre, slugs, raised beds and bike lanes 0.25 to 0.26; only hedge
trimmers, 0.21, fell below), 12 plainly irrelevant ones 0.022 to 0.244
(interest rates, elections, a phone chip, a celebrity divorce, a football
transfer; a jazz festival the highest). Near misses clear it: motorbike
sales 0.30, pasta prices 0.29, farm subsidies 0.27, a storm warning 0.27 (by
the weather turn). MiniLM cannot tell those apart by similarity alone; a
higher threshold gives fewer, surer finds and drops the weaker relevant ones
first. (One centroid of all interests, a weighted mean, separated the first
such set as well, but its scores shrink as memory grows more varied; the
closest interest does not.) Relevant items past ``max_new_per_run`` are
counted ("over the limit") and dropped: a feed that answers 304 next time is
not read again.

**Never twice.** A discovery's subject is ``news`` and its key ``item <hash
of the item's link>`` (fragment dropped, scheme and host lower-cased), so
one story is one fact even when two feeds carry it. The keys written, and
the feed-scoped GUIDs of their items, are also kept in ``job_state``
(``stored``, the newest :data:`MAX_STORED_IDS`), so an item whose link
changed but GUID did not is not stored again, and a discovery the user
forgot does not come back. The value holds the title, the link and a short
excerpt: ``«Title» from Feed name, https://... «Excerpt».``

**The embedder.** ``ctx.embedder`` when the job context carries one (in the
actor runtime, the Recall actor's: the job actor loads no model), else the
one a test gives :class:`ResearchJob`, else one built from
``settings.embedder`` in the job's own process (loaded only when there is
something new to score: a run of 304s loads no model).
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
import unicodedata
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser
from http.client import HTTPException, HTTPResponse
from io import BytesIO
from typing import Any
from urllib.parse import urljoin, urlsplit, urlunsplit
from xml.etree.ElementTree import Element, ParseError

import defusedxml.ElementTree as safe_xml
import numpy as np
from defusedxml import DefusedXmlException

from runtime.config import ResearchSettings
from runtime.llm.embedder import Embedder, make_embedder
from runtime.memories import privacy
from runtime.memories.decay import recency_weight
from runtime.memories.facts import FactIn
from runtime.memories.profiles import MemoryProfiles
from runtime.mind.contract import JobContext, JobResult
from runtime.store.database import Store
from runtime.store.job_state import get_state, set_state
from runtime.time.clock import DAY

log = logging.getLogger(__name__)

JOB = "research"
WRITER = "research"
SOURCE = "research"
KIND = "discovery"
SUBJECT = "news"
CONFIDENCE = 0.8
USER_AGENT = "Reverie-research/0.1 (+feeds chosen by the household)"
ACCEPT = ("application/rss+xml, application/atom+xml, application/rdf+xml;q=0.9, "
          "application/xml;q=0.8, text/xml;q=0.8, */*;q=0.1")
CHUNK = 65536

MAX_STORED_IDS = 10_000  # keys and GUIDs remembered as written
RAW_TEXT_CHARS = 20_000  # of an item's raw text read before HTML is cleaned
MAX_TITLE = 300
MAX_LINK = 1000
MAX_GUID = 1000
MAX_FEED_NAME = 80

# Interests: where they come from, and how much each counts.
WEIGHT_FACT = 1.0
WEIGHT_REFLECTION = 0.7
WEIGHT_EPISODE = 0.7
WEIGHT_TURN = 0.5
RECENCY_TAU_DAYS = 30.0
EPISODE_DAYS = 90.0
TURN_DAYS = 30.0
MAX_FACTS = 200
MAX_EPISODES = 60
MAX_TURNS = 200
MIN_TURN_WORDS = 4
MAX_INTEREST_CHARS = 500
# Portrait sections (runtime.memories.portrait.SECTIONS): who they are and the people
# around them say less about what they would like to read than the rest.
PORTRAIT_WEIGHTS = {"who": 0.5, "people": 0.5, "preferences": 1.0, "routines": 1.0,
                    "concerns": 1.0}
INTEREST_KEYS = ("preference_", "plan_", "event_", "hobby", "interest")
NEGATIVE = ("hates", "dislikes", "does not like", "doesn't like")

_ATOM_REL_OK = ("", "alternate")
_CITATION = re.compile(r"\[(?:[a-z_]+:\d+(?:,\s*)?)+\]|\((?:[a-z_]+:\d+(?:,\s*)?)+\)")
_BLOCK_TAGS = {"p", "br", "div", "li", "ul", "ol", "tr", "td", "th", "h1", "h2", "h3", "h4",
               "h5", "h6", "blockquote", "pre", "hr", "section", "article", "figure", "table"}
_SKIP_TAGS = {"script", "style", "template", "noscript", "iframe", "object", "svg", "math"}


# -- text ---------------------------------------------------------------------


class _TextOf(HTMLParser):
    """The visible text of an HTML fragment (scripts and styles dropped)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIP_TAGS:
            self._skipping += 1
        elif tag in _BLOCK_TAGS:
            self.parts.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIP_TAGS:
            self._skipping = max(0, self._skipping - 1)
        elif tag in _BLOCK_TAGS:
            self.parts.append(" ")

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            self.parts.append(data)


def plain(text: str) -> str:
    """One line of plain text: control, format (bidi overrides, zero-width) and
    quoting characters dropped, whitespace collapsed."""
    kept = "".join(" " if ch in "\t\n\r\f\v" else ch for ch in text
                   if ch in "\t\n\r\f\v" or unicodedata.category(ch) not in ("Cc", "Cf", "Co",
                                                                            "Cs"))
    return " ".join(kept.replace("«", '"').replace("»", '"').split())


def html_text(fragment: str) -> str:
    """Plain text of an HTML fragment (or of plain text holding ``<`` and ``&``)."""
    parser = _TextOf()
    try:
        parser.feed(fragment)
        parser.close()
    except (AssertionError, ValueError):  # html.parser gives up on some broken input
        return plain(re.sub(r"<[^>]*>", " ", fragment))
    return plain("".join(parser.parts))


def cut(text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut to at most ``limit`` characters, at a word when one is near
    (an ellipsis marks the cut); whether it was cut."""
    if len(text) <= limit:
        return text, False
    if limit <= 1:
        return text[:limit], True
    head = text[:limit - 1]
    space = head.rfind(" ")
    if space >= limit // 2:
        head = head[:space]
    return head.rstrip() + "…", True


def canonical_link(link: str) -> str:
    """A link as it identifies a story: fragment dropped, scheme and host lower case."""
    parts = urlsplit(link.strip())
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), parts.path or "/",
                       parts.query, ""))


def _digest(text: str, size: int = 24) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:size]


def item_key(link: str) -> str:
    """The discovery fact's key for the story at ``link``."""
    return f"item {_digest(canonical_link(link))}"


def guid_id(feed_url: str, guid: str) -> str:
    """A GUID as remembered: it is unique only within its feed."""
    return f"guid {_digest(feed_url + chr(10) + guid)}"


def feed_state_key(url: str) -> str:
    return f"feed {_digest(url, 16)}"


def host_of(url: str) -> str:
    return urlsplit(url).hostname or "?"


# -- fetching -----------------------------------------------------------------


class FeedFailed(Exception):
    """A feed could not be read; ``reason`` is what the run counts it under."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Fetched:
    status: int  # 200, or 304: not modified
    body: bytes = b""
    etag: str | None = None
    last_modified: str | None = None
    truncated: bool = False  # the body was cut at max_bytes


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    max_redirections = 5

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str,
                         headers: Any, newurl: str) -> urllib.request.Request | None:
        if urlsplit(newurl).scheme not in ("http", "https"):
            raise FeedFailed("bad-redirect")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _opener() -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(_HttpOnlyRedirects())


def _header(value: str | None, limit: int = 500) -> str | None:
    """A validator worth sending back: printable ASCII, bounded."""
    if not value or len(value) > limit or not value.isascii() or not value.isprintable():
        return None
    return value


def fetch(url: str, validators: dict[str, str], timeout_s: float, max_bytes: int,
          opener: urllib.request.OpenerDirector | None = None) -> Fetched:
    """GET ``url`` conditionally (``validators``: ``etag``, ``last_modified``).

    Raises :class:`FeedFailed` with the reason: ``timeout``, ``http-<code>``,
    ``unreachable``, ``tls``, ``bad-response``, ``bad-redirect``."""
    headers = {"User-Agent": USER_AGENT, "Accept": ACCEPT, "Accept-Encoding": "identity"}
    if validators.get("etag"):
        headers["If-None-Match"] = validators["etag"]
    if validators.get("last_modified"):
        headers["If-Modified-Since"] = validators["last_modified"]
    request = urllib.request.Request(url, headers=headers, method="GET")
    deadline = time.monotonic() + 2 * timeout_s  # the connection's, then the body's
    try:
        response: HTTPResponse = (opener or _opener()).open(request, timeout=timeout_s)
        with response:
            body, truncated = _read(response, max_bytes, deadline)
            return Fetched(status=response.status, body=body,
                           etag=_header(response.headers.get("ETag")),
                           last_modified=_header(response.headers.get("Last-Modified")),
                           truncated=truncated)
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 304:
            return Fetched(status=304)
        if 300 <= exc.code < 400:  # a redirect urllib refused (to file:, too many...)
            raise FeedFailed("bad-redirect") from None
        raise FeedFailed(f"http-{exc.code}") from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, TimeoutError):
            raise FeedFailed("timeout") from None
        if "ssl" in type(reason).__module__ or "CERTIFICATE" in str(reason).upper():
            raise FeedFailed("tls") from None
        raise FeedFailed("unreachable") from None
    except TimeoutError:
        raise FeedFailed("timeout") from None
    except (HTTPException, ConnectionError):
        raise FeedFailed("bad-response") from None
    except OSError:
        raise FeedFailed("unreachable") from None


def _read(response: HTTPResponse, max_bytes: int, deadline: float) -> tuple[bytes, bool]:
    """At most ``max_bytes`` of the body (and whether there was more), before
    ``deadline`` (else ``timeout``: a server that trickles bytes cannot hold the
    run)."""
    buf = bytearray()
    while len(buf) <= max_bytes:
        if time.monotonic() > deadline:
            raise FeedFailed("timeout")
        chunk = response.read1(CHUNK)
        if not chunk:
            return bytes(buf), False
        buf += chunk
    return bytes(buf[:max_bytes]), True


# -- parsing ------------------------------------------------------------------


@dataclass(frozen=True)
class FeedItem:
    key: str  # the discovery fact's key (from the link)
    ids: tuple[str, ...]  # the key, and the feed-scoped GUID when there is one
    title: str
    link: str
    text: str  # plain text, cut to max_item_chars (what is scored)
    excerpt: str  # plain text, cut to excerpt_chars (what is stored)

    def scored_text(self) -> str:
        return f"{self.title}. {self.text}" if self.text else self.title


@dataclass
class ParsedFeed:
    name: str = ""
    items: list[FeedItem] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    items_cut: int = 0  # items whose text was cut
    truncated: bool = False  # the document ended early (cut at max_feed_bytes)


def _local(tag: object) -> str:
    return tag.rsplit("}", 1)[-1].lower() if isinstance(tag, str) else ""


def _children(element: Element, name: str) -> Iterator[Element]:
    return (child for child in element if _local(child.tag) == name)


def _first_text(element: Element, *names: str) -> str:
    for name in names:
        for child in _children(element, name):
            if _local(child.tag) in ("content", "summary") and child.get("type") == "xhtml":
                text = "".join(child.itertext())
            else:
                text = child.text or ""
            if text.strip():
                return text[:RAW_TEXT_CHARS]
    return ""


def _item_link(element: Element, base: str) -> str:
    """An RSS ``<link>``, an Atom ``<link rel="alternate" href>``, an RDF
    ``rdf:about``, or a permalink GUID; resolved against the feed's URL."""
    for child in _children(element, "link"):
        href = child.get("href")
        if href is not None:
            if (child.get("rel") or "").lower() in _ATOM_REL_OK and href.strip():
                return urljoin(base, href.strip())
        elif child.text and child.text.strip():
            return urljoin(base, child.text.strip())
    for child in _children(element, "guid"):
        text = (child.text or "").strip()
        if child.get("isPermaLink", "true").lower() != "false" and text.startswith(
                ("http://", "https://")):
            return text
    about = next((v for k, v in element.attrib.items() if _local(k) == "about"), "")
    return urljoin(base, about.strip()) if about.strip() else ""


def _item_guid(element: Element) -> str:
    for name in ("guid", "id"):
        for child in _children(element, name):
            text = (child.text or "").strip()
            if text:
                return text[:MAX_GUID]
    return ""


def parse_feed(data: bytes, feed_url: str, settings: ResearchSettings,
               truncated: bool = False) -> ParsedFeed:
    """The items of an RSS or Atom document (at most ``max_items_per_feed``).

    Raises :class:`FeedFailed`: ``unsafe`` (entity declarations, external
    references), ``malformed`` (not XML, or broken before its end), ``not-a-feed``
    (XML, but neither RSS nor Atom). When ``truncated`` (the body was cut at
    ``max_feed_bytes``), the parse error at the cut is expected: the complete
    items before it are kept."""
    out = ParsedFeed(truncated=truncated)
    depth_names: list[str] = []
    root = ""
    try:
        for event, element in safe_xml.iterparse(BytesIO(data), events=("start", "end")):
            name = _local(element.tag)
            if event == "start":
                if not depth_names:
                    root = name
                depth_names.append(name)
                continue
            depth_names.pop()
            parent = depth_names[-1] if depth_names else ""
            if name == "title" and parent in ("channel", "feed") and not out.name:
                out.name = cut(plain(element.text or ""), MAX_FEED_NAME)[0]
            elif name in ("item", "entry") and parent in ("channel", "feed", "rdf", "rss"):
                if len(out.items) + sum(out.skipped.values()) < settings.max_items_per_feed:
                    _take(element, feed_url, settings, out)
                element.clear()
    except DefusedXmlException:
        raise FeedFailed("unsafe") from None
    except ParseError:
        if not truncated:
            raise FeedFailed("malformed") from None
    if root not in ("rss", "rdf", "feed"):
        raise FeedFailed("malformed" if truncated and not root else "not-a-feed")
    if not out.name:
        out.name = host_of(feed_url)
    return out


def _take(element: Element, feed_url: str, settings: ResearchSettings,
          out: ParsedFeed) -> None:
    link = _item_link(element, feed_url)
    if not link:
        out.skipped["no-link"] += 1
        return
    if urlsplit(link).scheme not in ("http", "https") or not urlsplit(link).hostname:
        out.skipped["bad-link"] += 1
        return
    if len(link) > MAX_LINK:
        out.skipped["long-link"] += 1
        return
    raw_title = _first_text(element, "title")
    raw_text = _first_text(element, "encoded", "content", "description", "summary")
    title, _ = cut(html_text(raw_title), MAX_TITLE)
    text = html_text(raw_text)
    if not title and not text:
        out.skipped["empty"] += 1
        return
    if not title:
        title, _ = cut(text, 80)
    scored, was_cut = cut(text, settings.max_item_chars)
    excerpt, _ = cut(text, settings.excerpt_chars)
    if was_cut or len(raw_text) >= RAW_TEXT_CHARS:
        out.items_cut += 1
    key = item_key(link)
    guid = _item_guid(element)
    ids = (key, guid_id(feed_url, guid)) if guid else (key,)
    out.items.append(FeedItem(key=key, ids=ids, title=title, link=link, text=scored,
                              excerpt=excerpt))


def discovery_value(item: FeedItem, feed_name: str) -> str:
    """What a discovery fact says: ``«Title» from Feed, link. «Excerpt».``"""
    value = f"«{item.title}» from {feed_name or 'a feed'}, {item.link}."
    if item.excerpt:
        value += f" «{item.excerpt}»."
    return value[:4000]


# -- interests ----------------------------------------------------------------


@dataclass(frozen=True)
class Interest:
    text: str
    weight: float
    origin: str  # portrait, fact, reflection, episode, turn


def _interest_text(text: str) -> str:
    text = re.sub(r"\s+([.,;:!?])", r"\1", plain(_CITATION.sub(" ", text)))
    return cut(text, MAX_INTEREST_CHARS)[0]


def portrait_lines(store: Store) -> list[tuple[str, str]]:
    """The latest portrait's lines, ``(section, text)``: from the synthesis job's
    versions (:func:`runtime.memories.portrait.latest_portrait`, the lines whose sources
    are still current) when that module is there and has one, else from a
    current ``portrait`` fact, line by line (section ""). None: ``[]``."""
    try:
        from runtime.memories.portrait import latest_portrait
    except ImportError:
        pass
    else:
        try:
            lines = [(str(line.section), str(line.text)) for line in latest_portrait(store)]
            if lines:
                return lines
        except Exception as exc:  # an optional input: research runs without it
            log.warning("research: the portrait could not be read (%s)", type(exc).__name__)
    fact = store.row(
        "SELECT value FROM facts WHERE kind = 'portrait' AND valid_to IS NULL AND disabled = 0"
        " ORDER BY recorded_at DESC, id DESC LIMIT 1")
    if fact is None:
        return []
    return [("", line.lstrip("-*• ")) for line in
            re.split(r"\n+|(?<=[.!?])\s+", str(fact["value"])) if line.strip()]


def interests(store: Store, profiles: MemoryProfiles, now: float) -> list[Interest]:
    """What the household cares about, from memory (see the module docstring),
    in a fixed order: portrait, facts, episodes, turns."""
    out: list[Interest] = []
    for section, line in portrait_lines(store):
        text = _interest_text(line)
        if len(text.split()) >= 2:
            out.append(Interest(text, PORTRAIT_WEIGHTS.get(section, WEIGHT_FACT), "portrait"))
    rows = store.rows(
        "SELECT kind, subject, key, value FROM facts WHERE valid_to IS NULL AND disabled = 0"
        " AND kind IN ('behavioral_pattern', 'user_specific', 'reflection')"
        f" AND {privacy.SHAREABLE}"  # a sensitive memory never leaves as a query
        " AND source != ? ORDER BY confirmed_at DESC, id DESC LIMIT ?", (SOURCE, MAX_FACTS * 4))
    facts = 0
    for row in rows:
        value = str(row["value"])
        if row["kind"] == "user_specific" and (
                not str(row["key"]).startswith(INTEREST_KEYS)
                or value.strip().lower().startswith(NEGATIVE)):
            continue
        text = _interest_text(value if len(value.split()) >= 2
                              else f"{str(row['key']).replace('_', ' ')}: {value}")
        if not text:
            continue
        weight = WEIGHT_REFLECTION if row["kind"] == "reflection" else WEIGHT_FACT
        out.append(Interest(text, weight, "reflection" if row["kind"] == "reflection"
                            else "fact"))
        facts += 1
        if facts >= MAX_FACTS:
            break
    for row in store.rows(
            "SELECT gist, coalesce(ended_at, started_at, created_at) AS at FROM episodes"
            f" WHERE disabled = 0 AND tombstoned_at IS NULL AND {privacy.SHAREABLE}"
            " AND coalesce(ended_at, started_at, created_at) >= ?"
            " ORDER BY at DESC, id DESC LIMIT ?", (now - EPISODE_DAYS * DAY, MAX_EPISODES)):
        text = _interest_text(str(row["gist"]))
        if text:
            out.append(Interest(text, WEIGHT_EPISODE * recency_weight(
                float(row["at"]), now, RECENCY_TAU_DAYS), "episode"))
    turns = 0
    for row in store.rows(
            "SELECT source, content, created_at FROM transcript WHERE role = 'user'"
            f" AND disabled = 0 AND {privacy.SHAREABLE} AND created_at >= ?"
            " ORDER BY created_at DESC, id DESC LIMIT ?",
            (now - TURN_DAYS * DAY, MAX_TURNS * 4)):
        if not profiles.for_source(str(row["source"])).patterns:
            continue
        text = _interest_text(str(row["content"]))
        if len(text.split()) < MIN_TURN_WORDS:
            continue
        out.append(Interest(text, WEIGHT_TURN * recency_weight(
            float(row["created_at"]), now, RECENCY_TAU_DAYS), "turn"))
        turns += 1
        if turns >= MAX_TURNS:
            break
    return out


def scores(items: np.ndarray, profile: np.ndarray, weights: Sequence[float]) -> np.ndarray:
    """Each item's highest ``weight x cosine`` over the interests (vectors are
    L2-normalised, so the dot product is the cosine)."""
    if len(items) == 0 or len(profile) == 0:
        return np.zeros(len(items), dtype=np.float32)
    sims = items.astype(np.float32) @ profile.astype(np.float32).T
    return np.asarray((sims * np.asarray(weights, dtype=np.float32)[None, :]).max(axis=1))


# -- the job ------------------------------------------------------------------


@dataclass
class Tally:
    feeds: Counter[str] = field(default_factory=Counter)  # read, not-modified, failed:<reason>
    items: Counter[str] = field(default_factory=Counter)  # new, known, kept, below, over-limit
    skipped: Counter[str] = field(default_factory=Counter)
    cut: Counter[str] = field(default_factory=Counter)  # feeds and items truncated

    def detail(self) -> str:
        failed = {k.split(":", 1)[1]: v for k, v in self.feeds.items() if k.startswith("failed:")}
        parts = [f"feeds: {self.feeds['read']} read, {self.feeds['not-modified']} not modified, "
                 f"{sum(failed.values())} failed"
                 + (f" ({', '.join(f'{k} {v}' for k, v in sorted(failed.items()))})"
                    if failed else ""),
                 f"items: {self.items['new']} new, {self.items['known']} known, "
                 f"{self.items['kept']} kept, {self.items['below']} below the threshold, "
                 f"{self.items['over-limit']} over the limit"]
        if self.skipped:
            parts.append("skipped: " + ", ".join(f"{k} {v}" for k, v in
                                                 sorted(self.skipped.items())))
        if self.cut:
            parts.append("truncated: " + ", ".join(f"{k} {v}" for k, v in
                                                   sorted(self.cut.items())))
        return "; ".join(parts)

    def as_state(self) -> dict[str, dict[str, int]]:
        return {"feeds": dict(self.feeds), "items": dict(self.items),
                "skipped": dict(self.skipped), "truncated": dict(self.cut)}


@dataclass(frozen=True)
class Candidate:
    item: FeedItem
    feed_name: str
    host: str


class ResearchJob:
    """The job, with an embedder a test may give (else ``ctx.embedder``, else
    one built from the settings when first needed)."""

    def __init__(self, embedder: Embedder | None = None) -> None:
        self.embedder = embedder

    def _embedder(self, ctx: JobContext) -> Embedder:
        if ctx.embedder is not None:
            return ctx.embedder
        if self.embedder is None:
            log.info("research: no embedder in the job context; loading %s",
                     ctx.settings.embedder.kind)
            self.embedder = make_embedder(ctx.settings.embedder)
        return self.embedder

    def __call__(self, ctx: JobContext) -> JobResult:
        cfg: ResearchSettings = ctx.settings.research
        now = ctx.clock.now()
        last = get_state(ctx.store, JOB, "last_run_at")
        if last is not None and now < float(last) + cfg.every_s:
            return JobResult(items=0, detail=f"not due: next run in "
                                             f"{int(float(last) + cfg.every_s - now)} s")
        if not cfg.feeds:
            return JobResult(items=0, detail="no feeds configured")
        profiles = MemoryProfiles.load(ctx.settings.memory.profiles_file)
        if not profiles.for_source(SOURCE).facts:
            return JobResult(items=0, detail=f"source {SOURCE} does not feed facts "
                                             "(memory profiles)")
        wanted = interests(ctx.store, profiles, now)
        if not wanted:
            return JobResult(items=0, detail="no interests in memory yet")

        tally = Tally()
        stored: list[str] = list(get_state(ctx.store, JOB, "stored", []))
        known = set(stored)
        candidates: list[Candidate] = []
        validators: dict[str, dict[str, str]] = {}
        more = False
        for url in cfg.feeds:
            if ctx.out_of_time():
                more = True
                break
            state_key = feed_state_key(url)
            fresh = self._read_feed(ctx, url, cfg, tally)
            if fresh is None:
                continue
            parsed, validator = fresh
            if validator is not None:
                validators[state_key] = validator
            for item in parsed.items:
                if any(i in known for i in item.ids) or ctx.store.scalar(
                        "SELECT 1 FROM facts WHERE subject = ? AND key = ? LIMIT 1",
                        (SUBJECT, item.key)):
                    tally.items["known"] += 1
                    continue
                known.update(item.ids)  # the same story twice in this run: once
                tally.items["new"] += 1
                candidates.append(Candidate(item, parsed.name, host_of(url)))

        written = self._keep(ctx, cfg, wanted, candidates, stored, tally) if candidates else 0
        for state_key, validator in validators.items():  # after the writes: a crash re-reads
            set_state(ctx.store, JOB, state_key, validator)
        set_state(ctx.store, JOB, "last", tally.as_state())
        if not more:
            set_state(ctx.store, JOB, "last_run_at", now)
        detail = tally.detail()
        log.info("research job: %s", detail)
        return JobResult(items=written, detail=detail, more=more)

    def _read_feed(self, ctx: JobContext, url: str, cfg: ResearchSettings,
                   tally: Tally) -> tuple[ParsedFeed, dict[str, str] | None] | None:
        """The feed's new document, parsed, and the validators to keep (None:
        keep the old ones); None when it did not change or failed."""
        state_key = feed_state_key(url)
        old = get_state(ctx.store, JOB, state_key, {}) or {}
        host = host_of(url)
        try:
            got = fetch(url, {k: str(v) for k, v in old.items() if v}, cfg.timeout_s,
                        cfg.max_feed_bytes)
            if got.status == 304:
                tally.feeds["not-modified"] += 1
                log.debug("research: %s not modified", host)
                return None
            parsed = parse_feed(got.body, url, cfg, truncated=got.truncated)
        except FeedFailed as exc:
            tally.feeds[f"failed:{exc.reason}"] += 1
            log.warning("research: feed at %s skipped: %s", host, exc.reason)
            return None
        tally.feeds["read"] += 1
        tally.skipped.update(parsed.skipped)
        if parsed.truncated:
            tally.cut["feeds"] += 1
        if parsed.items_cut:
            tally.cut["items"] += parsed.items_cut
        validator = {k: v for k, v in (("etag", got.etag),
                                       ("last_modified", got.last_modified)) if v}
        return parsed, validator

    def _keep(self, ctx: JobContext, cfg: ResearchSettings, wanted: list[Interest],
              candidates: list[Candidate], stored: list[str], tally: Tally) -> int:
        """Score the new items, write the best relevant ones; how many were written."""
        embedder = self._embedder(ctx)
        profile = embedder.embed([i.text for i in wanted])
        vectors = embedder.embed([c.item.scored_text() for c in candidates])
        found = scores(vectors, profile, [i.weight for i in wanted])
        ranked = sorted(zip(found.tolist(), candidates, strict=True),
                        key=lambda sc: (-sc[0], sc[1].item.key))
        written = 0
        for score, cand in ranked:
            if score < cfg.threshold:
                tally.items["below"] += 1
                continue
            if written >= cfg.max_new_per_run:
                tally.items["over-limit"] += 1
                continue
            fact = FactIn(kind=KIND, subject=SUBJECT, key=cand.item.key,
                          value=discovery_value(cand.item, cand.feed_name),
                          confidence=CONFIDENCE, source=SOURCE,
                          provenance=[SOURCE, f"feed:{cand.host}"])
            try:
                _, decision = ctx.writer.add_fact(fact, WRITER)
            except ValueError as exc:  # the kind or the source switched off in config
                tally.items["refused"] += 1
                log.warning("research: discovery refused: %s", type(exc).__name__)
                continue
            log.debug("research: kept an item from %s (score %.3f, %s)", cand.host, score,
                      decision.action)
            written += 1
            tally.items["kept"] += 1
            stored.extend(cand.item.ids)
            set_state(ctx.store, JOB, "stored", stored[-MAX_STORED_IDS:])
        return written


def run(ctx: JobContext) -> JobResult:
    """The ``research`` job (a :data:`runtime.mind.contract.JobFn`)."""
    return ResearchJob()(ctx)
