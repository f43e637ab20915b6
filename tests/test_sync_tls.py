"""Capability sync over TLS, against real servers on loopback: Radicale over HTTPS
(CalDAV, CardDAV, and a calendar collection read as one iCalendar document) and
Dovecot with IMAP over TLS (imaps) and STARTTLS. The servers' certificates come
from the session's test CA (``tests.pki``); a connector trusts it only through
its ``ca_file``.

Plain IMAP is allowed on loopback only, so the STARTTLS tests make the
connector see the loopback server as another host (``is_loopback`` patched):
everything else is the real handshake and the real server."""

from __future__ import annotations

import re
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


def logins(dovecot: Dovecot) -> list[str]:
    """Dovecot's log lines of successful IMAP logins."""
    log = dovecot.root / "dovecot.log"
    return re.findall(r"imap-login: Info: Login: .*", log.read_text()) if log.exists() else []


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
    assert logins(dovecot_tls)[before:] == [] and h.counts() == (0, 0)


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
    assert logins(dovecot_tls)[before:] == []


@pytest.mark.usefixtures("remote")
def test_another_host_without_starttls_never_gets_the_password(
        harness: Callable[..., Harness], dovecot_plain: Dovecot,
        caplog: pytest.LogCaptureFixture) -> None:
    h = harness(imap_conf(dovecot_plain, "box", ["INBOX"]))

    run = h.run()

    assert run.outcome == "failed"
    assert outcomes(h) == {"box": "failed, TLSFailed: the server offers no STARTTLS;"
                               " plain IMAP is for loopback only"}
    log = (dovecot_plain.root / "dovecot.log")
    text = log.read_text() if log.exists() else ""
    assert "Login:" not in text and "auth failed" not in text
    assert GOOD not in caplog.text
