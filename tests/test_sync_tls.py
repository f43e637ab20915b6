"""Capability sync over TLS, against real servers on loopback: Radicale over HTTPS
(CalDAV, CardDAV, and a calendar collection read as one iCalendar document) and
Dovecot with IMAP over TLS (imaps) and STARTTLS. The servers' certificates come
from the session's test CA (``tests.pki``); a connector trusts it only through
its ``ca_file``.

A password goes in clear (plain http, IMAP without STARTTLS) to loopback only,
unless the connector has ``allow_plaintext``; so the STARTTLS and plain-text
tests make the connectors see the loopback server as another host
(``is_loopback`` patched): everything else is the real handshake and the real
server.

That a password was *not* sent is read from the server's own log (Dovecot's
logins, Radicale's requests) only once a probe the test makes afterwards is in
it: a log read before it is written would show nothing either way."""

from __future__ import annotations

import imaplib
import logging
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.mind.sync import connectors
from runtime.store.job_state import get_state
from tests import test_sync
from tests.pki import Pki
from tests.test_sync import (
    GOOD,
    PROBE,
    PROBE_PW,
    PW_ENV,
    USER,
    Dovecot,
    Harness,
    Radicale,
    caldav_conf,
    carddav_conf,
    ical_conf,
    imap_conf,
    mail,
    vcalendar,
    vcard,
    vevent,
)
from tests.waiting import wait_for

# test_sync's fixtures: its clock (T0), the job harness, the passwords' variables
clock = test_sync.clock
harness = test_sync.harness
passwords = test_sync.passwords

TLS_FAILED = "failed, TLSFailed: the TLS handshake or the certificate check failed"
PLAIN_HTTP = ("failed, PlaintextRefused: the password would go in clear over http to another"
              " host; use https, or set allow_plaintext = true for this connector")
PLAIN_IMAP = ("failed, PlaintextRefused: the server offers no STARTTLS and the password would"
              " go in clear to another host; use imaps, or set allow_plaintext = true for"
              " this connector")


def outcomes(h: Harness) -> dict[str, str]:
    """Each connector's outcome from the job's record of its last run, the
    library's exception type left out."""
    last = get_state(h.memory.store, "sync", "last")
    return {name: r["outcome"] + (", " + re.sub(r" \(\w+\)$", "", r["error"])
                                  if r.get("error") else "")
            for name, r in last.items()}


@pytest.fixture(scope="module")
def radicale_tls(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Radicale]:
    server = Radicale(tmp_path_factory.mktemp("radicale-tls"), tls=pki)
    try:
        family = server.calendar("family")
        server.put_event(family, "dentist", vcalendar(vevent(
            "dentist-1@example.org", "Dentist appointment", ":20231120T100000Z",
            ":20231120T110000Z")))
        people = server.address_book("people")
        server.put_card(people, "ana", vcard("ana-1@example.org", "Ana Silva",
                                             "EMAIL:ana@example.org"))
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def dovecot_tls(pki: Pki) -> Iterator[Dovecot]:
    server = Dovecot(tls=pki)
    try:
        server.add("INBOX", mail("Bob <bob@example.org>", "Lunch on Friday",
                                 "Shall we have lunch on Friday?\r\n", "lunch@example.org"))
        yield server.start()
    finally:
        server.close()


@pytest.fixture(scope="module")
def radicale_lan(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Radicale]:
    """Plain-http Radicale, each request in its log: the same calendar and card."""
    server = Radicale(tmp_path_factory.mktemp("radicale-lan"), log_level="info")
    try:
        family = server.calendar("family")
        server.put_event(family, "dentist", vcalendar(vevent(
            "dentist-1@example.org", "Dentist appointment", ":20231120T100000Z",
            ":20231120T110000Z")))
        people = server.address_book("people")
        server.put_card(people, "ana", vcard("ana-1@example.org", "Ana Silva",
                                             "EMAIL:ana@example.org"))
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def dovecot_plain() -> Iterator[Dovecot]:
    server = Dovecot()
    try:
        yield server.start()
    finally:
        server.close()


def dav_connectors(radicale: Radicale, ca_file: Path | None,
                   carddav_ca: Path | None = None) -> list[dict[str, Any]]:
    """CalDAV, CardDAV and iCalendar from the same HTTPS Radicale."""
    def ca(path: Path | None) -> dict[str, Any]:
        return {"ca_file": str(path)} if path else {}

    return [{**caldav_conf(radicale, "cal", "family"), **ca(ca_file)},
            {**carddav_conf(radicale, "book", "people"), **ca(carddav_ca or ca_file)},
            {**ical_conf(f"{radicale.base}/{USER}/family/", "feed"), "username": USER,
             "password_env": PW_ENV, **ca(ca_file)}]


def logins(dovecot: Dovecot, user: str = USER) -> list[str]:
    """Dovecot's log lines of ``user``'s successful IMAP logins."""
    log = dovecot.root / "dovecot.log"
    text = log.read_text() if log.exists() else ""
    return re.findall(rf"imap-login: Info: Login: user=<{re.escape(user)}>.*", text)


def logins_since(dovecot: Dovecot, before: int) -> list[str]:
    """The connector user's logins after the first ``before``, read once a
    login the test makes now (as another user, plain IMAP on loopback) is in
    Dovecot's log: the log is written by its own process, later."""
    probes = len(logins(dovecot, PROBE))
    conn = imaplib.IMAP4("127.0.0.1", dovecot.port, timeout=30)
    try:
        conn.login(PROBE, PROBE_PW)
    finally:
        conn.logout()
    assert wait_for(lambda: len(logins(dovecot, PROBE)) > probes, 30), "no probe login logged"
    return logins(dovecot)[before:]


def log_size(radicale: Radicale) -> int:
    return radicale.log_path.stat().st_size


def requests_since(radicale: Radicale, start: int) -> list[str]:
    """The requests Radicale logged (at info) after byte ``start``, read once a
    probe request the test makes now is in the log."""
    probe = f"/probe-{uuid.uuid4().hex}/"
    radicale.http.request("PROPFIND", probe, headers={"Depth": "0"})

    def text() -> str:
        with radicale.log_path.open("rb") as f:
            f.seek(start)
            return f.read().decode("utf-8", "replace")

    assert wait_for(lambda: probe in text(), 30), "no probe request logged"
    before_probe = text().split(probe)[0]
    return re.findall(r"\b[A-Z]+ request for '[^']*'", before_probe)


def test_caldav_carddav_and_ical_over_https_trust_the_ca_file(
        harness: Callable[..., Harness], radicale_tls: Radicale, pki: Pki) -> None:
    assert radicale_tls.base.startswith("https://")
    h = harness(*dav_connectors(radicale_tls, pki.ca))

    run = h.run()

    assert run.outcome == "ok", run.error
    assert h.values("sync:cal") == [
        "Dentist appointment: Monday 20 November 2023, 10:00 to 11:00."]
    assert h.values("sync:feed") == h.values("sync:cal")
    assert [r["subject"] for r in h.facts("sync:book")] == ["Ana Silva"]


def test_https_signed_by_a_ca_not_trusted_fails_as_tls_and_stores_nothing(
        harness: Callable[..., Harness], radicale_tls: Radicale, pki: Pki) -> None:
    # CalDAV and the feed trust the system's CAs only; CardDAV trusts another CA
    connectors_ = dav_connectors(radicale_tls, None, carddav_ca=pki.other_ca)
    h = harness(*connectors_)

    run = h.run()

    assert run.outcome == "failed"
    assert outcomes(h) == {"cal": TLS_FAILED, "book": TLS_FAILED, "feed": TLS_FAILED}
    assert h.counts() == (0, 0)


def test_imaps_trusts_the_ca_file_and_logs_in_over_tls(
        harness: Callable[..., Harness], dovecot_tls: Dovecot, pki: Pki) -> None:
    before = len(logins(dovecot_tls))
    h = harness({**imap_conf(dovecot_tls, "box", ["INBOX"]),
                 "url": f"imaps://127.0.0.1:{dovecot_tls.tls_port}", "ca_file": str(pki.ca)})

    run = h.run()

    assert run.outcome == "ok", run.error
    assert len(h.values("sync:box")) == 1 and "Lunch on Friday" in h.values("sync:box")[0]
    # Dovecot's log process writes the line: waited for, not assumed
    assert wait_for(lambda: len(logins(dovecot_tls)) > before, 20)
    new = logins(dovecot_tls)[before:]
    assert len(new) == 1 and f"user=<{USER}>" in new[0] and ", TLS," in new[0], new


def test_imaps_signed_by_another_ca_fails_before_the_password_is_sent(
        harness: Callable[..., Harness], dovecot_tls: Dovecot, pki: Pki) -> None:
    before = len(logins(dovecot_tls))
    h = harness({**imap_conf(dovecot_tls, "box", ["INBOX"]),
                 "url": f"imaps://127.0.0.1:{dovecot_tls.tls_port}",
                 "ca_file": str(pki.other_ca)})

    run = h.run()

    assert run.outcome == "failed"
    assert outcomes(h) == {"box": TLS_FAILED}
    assert logins_since(dovecot_tls, before) == [] and h.counts() == (0, 0)


@pytest.fixture
def remote(monkeypatch: pytest.MonkeyPatch) -> None:
    """The IMAP connector sees every host as another machine's."""
    monkeypatch.setattr(connectors, "is_loopback", lambda host: False)


@pytest.mark.usefixtures("remote")
def test_plain_imap_to_another_host_upgrades_with_starttls(
        harness: Callable[..., Harness], dovecot_tls: Dovecot, pki: Pki) -> None:
    before = len(logins(dovecot_tls))
    h = harness({**imap_conf(dovecot_tls, "box", ["INBOX"]), "ca_file": str(pki.ca)})

    run = h.run()

    assert run.outcome == "ok", run.error
    assert len(h.values("sync:box")) == 1
    assert wait_for(lambda: len(logins(dovecot_tls)) > before, 20)
    new = logins(dovecot_tls)[before:]
    assert len(new) == 1 and ", TLS," in new[0], new  # the login went over STARTTLS


@pytest.mark.usefixtures("remote")
def test_starttls_with_a_certificate_not_trusted_fails(
        harness: Callable[..., Harness], dovecot_tls: Dovecot) -> None:
    before = len(logins(dovecot_tls))
    h = harness(imap_conf(dovecot_tls, "box", ["INBOX"]))  # the system's CAs only

    run = h.run()

    assert run.outcome == "failed"
    assert outcomes(h) == {"box": TLS_FAILED}
    assert logins_since(dovecot_tls, before) == []


@pytest.mark.usefixtures("remote")
def test_another_host_without_starttls_never_gets_the_password(
        harness: Callable[..., Harness], dovecot_plain: Dovecot,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    before = len(logins(dovecot_plain))
    h = harness(imap_conf(dovecot_plain, "box", ["INBOX"]))

    run = h.run()

    assert run.outcome == "failed"
    assert outcomes(h) == {"box": PLAIN_IMAP}
    assert logins_since(dovecot_plain, before) == [] and h.counts() == (0, 0)
    text = (dovecot_plain.root / "dovecot.log").read_text()  # there: the probe is in it
    assert f"user=<{USER}>" not in text and "auth failed" not in text
    assert GOOD not in caplog.text


@pytest.mark.usefixtures("remote")
def test_allow_plaintext_lets_imap_log_in_without_tls(
        harness: Callable[..., Harness], dovecot_plain: Dovecot,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    before = len(logins(dovecot_plain))
    h = harness({**imap_conf(dovecot_plain, "box", ["INBOX"]), "allow_plaintext": True})

    run = h.run()

    assert run.outcome == "ok", run.error
    new = logins_since(dovecot_plain, before)
    assert len(new) == 1 and ", TLS," not in new[0], new  # in clear, as allowed
    assert "sync box: its password goes in clear to another host" in caplog.text
    assert GOOD not in caplog.text


# -- plain http: CalDAV, CardDAV and iCalendar -----------------------------------------


def test_plain_http_on_loopback_needs_no_allowing(
        harness: Callable[..., Harness], radicale_lan: Radicale) -> None:
    h = harness(*dav_connectors(radicale_lan, None))

    run = h.run()

    assert run.outcome == "ok", run.error
    assert h.values("sync:cal") == [
        "Dentist appointment: Monday 20 November 2023, 10:00 to 11:00."]


@pytest.mark.usefixtures("remote")
def test_plain_http_to_another_host_is_refused_before_the_password_is_sent(
        harness: Callable[..., Harness], radicale_lan: Radicale,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    start = log_size(radicale_lan)
    h = harness(*dav_connectors(radicale_lan, None))

    run = h.run()

    assert run.outcome == "failed"
    assert outcomes(h) == {"cal": PLAIN_HTTP, "book": PLAIN_HTTP, "feed": PLAIN_HTTP}
    assert requests_since(radicale_lan, start) == []  # not even a request without it
    assert h.counts() == (0, 0)
    assert GOOD not in caplog.text


def test_a_refused_connector_keeps_what_it_had_and_allow_plaintext_syncs_it(
        harness: Callable[..., Harness], radicale_lan: Radicale,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    h = harness(*dav_connectors(radicale_lan, None))
    assert h.run().outcome == "ok"  # while the server was on loopback
    facts = {name: h.facts(f"sync:{name}") for name in ("cal", "book", "feed")}
    assert all(facts.values())
    state = h.memory.store.rows("SELECT key, value FROM job_state WHERE job = 'sync'"
                                " AND key LIKE 'connector:%' ORDER BY key")
    counts = h.counts()
    monkeypatch.setattr(connectors, "is_loopback", lambda host: False)  # now on the LAN

    refused = h.run()

    assert refused.outcome == "failed"
    assert outcomes(h) == {"cal": PLAIN_HTTP, "book": PLAIN_HTTP, "feed": PLAIN_HTTP}
    assert {name: h.facts(f"sync:{name}") for name in facts} == facts  # nothing retired
    assert h.memory.store.rows("SELECT key, value FROM job_state WHERE job = 'sync'"
                               " AND key LIKE 'connector:%' ORDER BY key") == state
    assert h.counts() == counts

    sync = h.settings.sync
    h.settings = h.settings.model_copy(update={"sync": sync.model_copy(update={
        "connectors": [c.model_copy(update={"allow_plaintext": True})
                       for c in sync.connectors]})})
    start = log_size(radicale_lan)

    allowed = h.run()

    assert allowed.outcome == "ok", allowed.error
    assert {name: h.facts(f"sync:{name}") for name in facts} == facts  # nothing new either
    assert requests_since(radicale_lan, start)  # this time it went to the server
    for name in facts:
        assert f"sync {name}: its password goes in clear to another host" in caplog.text
    assert GOOD not in caplog.text
