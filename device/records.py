"""What the edge delivers: one location record and one presence record.

Every adapter (OwnTracks, Home Assistant, Zigbee2MQTT, ESPresense, gpsd) maps
what its sensors publish onto these two shapes, or raises :class:`Rejected`
with a reason from :data:`REASONS`; the bridge counts rejections by reason and
keeps running. Times are seconds since the epoch (UTC); the household's zone
is applied only when they are shown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

PresenceState = Literal["home", "away"]

#: Why a payload was refused; the keys of ``mqtt.rejected`` in ``reverie status --json``.
REASONS = (
    "malformed-json",   # not JSON (or not UTF-8) where JSON was expected
    "wrong-type",       # a field of the wrong type, or a payload that is not an object
    "missing-field",    # a required field is absent
    "bad-coordinates",  # NaN, infinite or out-of-range latitude/longitude/accuracy
    "bad-timestamp",    # far in the future or the past, or not a number
    "too-large",        # over the configured payload size
    "unknown-topic",    # under a subscribed pattern, but nothing we know reads it
    "bad-value",        # a field with a value outside what the format allows
)

Reason = Literal["malformed-json", "wrong-type", "missing-field", "bad-coordinates",
                 "bad-timestamp", "too-large", "unknown-topic", "bad-value"]


class Rejected(ValueError):
    """A payload refused, with the reason it is counted under."""

    def __init__(self, reason: Reason, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason: Reason = reason
        self.detail = detail


@dataclass(frozen=True)
class LocationRecord:
    """One position fix of a person (or of the hub itself, from gpsd)."""

    person: str
    lat: float
    lon: float
    at: float                       # when the fix was taken
    source: str                     # the adapter: "owntracks", "ha_tracker", "gpsd"
    accuracy_m: float | None = None
    device: str | None = None       # the phone / tracker / receiver it came from
    place: str | None = None        # a named region, when the sender gave one
    event: str | None = None        # "enter" / "leave" for region transitions

    def __post_init__(self) -> None:
        check_coordinates(self.lat, self.lon, self.accuracy_m)


@dataclass(frozen=True)
class PresenceRecord:
    """Where a person is: home (in a room, when known) or away.

    ``activity``: someone is active at home right now (motion, occupancy), which
    resets the idle gate; a phone merely being home is presence, not activity."""

    person: str
    state: PresenceState
    at: float
    source: str                     # the adapter: "zigbee2mqtt", "espresense", "ha_person"...
    place: str | None = None        # room or zone
    activity: bool = False


Record = LocationRecord | PresenceRecord


def check_coordinates(lat: float, lon: float, accuracy_m: float | None = None) -> None:
    """Raise :class:`Rejected` ("bad-coordinates") unless these are a real position."""
    for name, value in (("lat", lat), ("lon", lon)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise Rejected("wrong-type", f"{name} is not a number")
        try:
            finite = math.isfinite(value)
        except OverflowError:  # an int too large for a float (JSON allows it)
            finite = False
        if not finite:
            raise Rejected("bad-coordinates", f"{name} is not finite")
    if not -90.0 <= lat <= 90.0 or not -180.0 <= lon <= 180.0:
        raise Rejected("bad-coordinates", "latitude/longitude out of range")
    if accuracy_m is not None:
        if isinstance(accuracy_m, bool) or not isinstance(accuracy_m, (int, float)):
            raise Rejected("wrong-type", "accuracy is not a number")
        try:
            finite = math.isfinite(accuracy_m)
        except OverflowError:
            finite = False
        if not finite or accuracy_m < 0:
            raise Rejected("bad-coordinates", "accuracy is negative or not finite")
