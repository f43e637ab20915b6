"""Capability sync: calendars, mail and contacts become memories.

The ``sync`` job (:mod:`runtime.mind.sync.job`) runs every connector configured
under ``[[sync.connectors]]`` through one interface
(:mod:`runtime.mind.sync.connectors`): CalDAV and iCalendar over HTTP(S)
(recurring events expanded within a window around now), IMAP (headers and a
bounded excerpt of the plain-text body, only from the configured folders) and
CardDAV. Each item becomes a fact of source ``sync:<connector>``
(:mod:`runtime.mind.sync.items` renders them), so source profiles govern it like
any other source.

Sync is incremental (sync tokens, ETags, UIDVALIDITY and the last UID, kept in
``job_state``) and de-duplicated: an item seen before and unchanged writes
nothing. It is deterministic: no language model reads outside text, which is
only ever stored as quoted data.
"""
