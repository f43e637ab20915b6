"""Time expressions (runtime.time.expressions) read against a fixed clock in the
household's zone: each span's local bounds, the finder inside sentences, and the
errors for what is not a time."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from runtime.time.expressions import Span, TimeExpressionError, find, parse

LISBON = ZoneInfo("Europe/Lisbon")
# Monday 30 November 2026, 15:00 in Lisbon
NOW = datetime(2026, 11, 30, 15, 0, tzinfo=LISBON).timestamp()


def local(span: Span, zone: ZoneInfo = LISBON) -> tuple[str, str]:
    fmt = "%Y-%m-%d %H:%M"
    return (datetime.fromtimestamp(span.start, zone).strftime(fmt),
            datetime.fromtimestamp(span.end, zone).strftime(fmt))


CASES = [
    ("today", "2026-11-30 00:00", "2026-12-01 00:00"),
    ("yesterday", "2026-11-29 00:00", "2026-11-30 00:00"),
    ("the day before yesterday", "2026-11-28 00:00", "2026-11-29 00:00"),
    ("this morning", "2026-11-30 05:00", "2026-11-30 12:00"),
    ("Yesterday evening", "2026-11-29 17:00", "2026-11-29 22:00"),
    ("last night", "2026-11-29 17:00", "2026-11-30 05:00"),
    ("tonight", "2026-11-30 17:00", "2026-12-01 05:00"),
    ("last week", "2026-11-23 00:00", "2026-11-30 00:00"),
    ("this week", "2026-11-30 00:00", "2026-12-07 00:00"),
    ("last weekend", "2026-11-28 00:00", "2026-11-30 00:00"),
    ("this month", "2026-11-01 00:00", "2026-12-01 00:00"),
    ("last month", "2026-10-01 00:00", "2026-11-01 00:00"),
    ("last year", "2025-01-01 00:00", "2026-01-01 00:00"),
    # "N months ago": the calendar month holding the instant N months back
    ("3 months ago", "2026-08-01 00:00", "2026-09-01 00:00"),
    ("three months ago", "2026-08-01 00:00", "2026-09-01 00:00"),
    ("a week ago", "2026-11-23 00:00", "2026-11-30 00:00"),
    ("two days ago", "2026-11-28 00:00", "2026-11-29 00:00"),
    ("2 years ago", "2024-01-01 00:00", "2025-01-01 00:00"),
    ("the past 2 weeks", "2026-11-16 15:00", "2026-11-30 15:00"),
    # a month: the most recent one that has begun (the current one counts)
    ("in April", "2026-04-01 00:00", "2026-05-01 00:00"),
    ("December", "2025-12-01 00:00", "2026-01-01 00:00"),
    ("November", "2026-11-01 00:00", "2026-12-01 00:00"),
    ("last November", "2025-11-01 00:00", "2025-12-01 00:00"),
    ("next April", "2027-04-01 00:00", "2027-05-01 00:00"),
    ("May 2023", "2023-05-01 00:00", "2023-06-01 00:00"),
    ("in May, 2023", "2023-05-01 00:00", "2023-06-01 00:00"),
    ("2023-05", "2023-05-01 00:00", "2023-06-01 00:00"),
    ("2023-05-07", "2023-05-07 00:00", "2023-05-08 00:00"),
    ("7 May 2023", "2023-05-07 00:00", "2023-05-08 00:00"),
    ("May 7th, 2023", "2023-05-07 00:00", "2023-05-08 00:00"),
    ("the 7th of May", "2026-05-07 00:00", "2026-05-08 00:00"),
    ("December 25", "2025-12-25 00:00", "2025-12-26 00:00"),
    ("2023", "2023-01-01 00:00", "2024-01-01 00:00"),
    ("in 2023", "2023-01-01 00:00", "2024-01-01 00:00"),
    ("last summer", "2026-06-01 00:00", "2026-09-01 00:00"),
    ("summer 2023", "2023-06-01 00:00", "2023-09-01 00:00"),
    ("last winter", "2025-12-01 00:00", "2026-03-01 00:00"),
    ("last Monday", "2026-11-23 00:00", "2026-11-24 00:00"),
    ("on Friday", "2026-11-27 00:00", "2026-11-28 00:00"),
    ("next Monday", "2026-12-07 00:00", "2026-12-08 00:00"),
    ("early November 2022", "2022-11-01 00:00", "2022-11-11 00:00"),
    ("the end of May 2023", "2023-05-21 00:00", "2023-06-01 00:00"),
    ("the second week of November 2023", "2023-11-08 00:00", "2023-11-15 00:00"),
    ("the week before 16 November 2023", "2023-11-09 00:00", "2023-11-16 00:00"),
    ("the weekend before 20 October 2023", "2023-10-14 00:00", "2023-10-16 00:00"),
    ("the week of 23 August 2023", "2023-08-21 00:00", "2023-08-28 00:00"),
    ("between 11 and 15 August 2023", "2023-08-11 00:00", "2023-08-16 00:00"),
    ("from August 11 to August 15, 2023", "2023-08-11 00:00", "2023-08-16 00:00"),
    ("since March", "2026-03-01 00:00", "2026-11-30 15:00"),
]


@pytest.mark.parametrize(("expr", "start", "end"), CASES)
def test_spans_against_a_fixed_clock(expr: str, start: str, end: str) -> None:
    assert local(parse(expr, NOW, LISBON)) == (start, end)


def test_spans_are_local_days_across_a_dst_change() -> None:
    """Lisbon went to summer time on 29 March 2026: that day is 23 hours long,
    and its bounds are local midnights, not UTC ones."""
    day = parse("2026-03-29", NOW, LISBON)
    assert day.end - day.start == 23 * 3600
    assert local(day) == ("2026-03-29 00:00", "2026-03-30 00:00")
    tokyo = ZoneInfo("Asia/Tokyo")
    # the same instant is already 1 December in Tokyo: "today" follows the zone
    assert local(parse("today", NOW, tokyo), tokyo) == ("2026-12-01 00:00", "2026-12-02 00:00")


def test_a_span_is_half_open() -> None:
    span = parse("May 2023", NOW, LISBON)
    assert span.start in span and span.end not in span and span.end - 1 in span


@pytest.mark.parametrize(("sentence", "expr", "start", "end"), [
    ("What did Caroline do last week?", "last week", "2026-11-23 00:00", "2026-11-30 00:00"),
    ("What did we cook 3 months ago?", "3 months ago", "2026-08-01 00:00", "2026-09-01 00:00"),
    ("Where was Tim in the week before 16 November 2023?", "the week before 16 november 2023",
     "2023-11-09 00:00", "2023-11-16 00:00"),
    ("Who did Maria have dinner with on May 3, 2023?", "may 3 2023",
     "2023-05-03 00:00", "2023-05-04 00:00"),
    ("Which outdoor spot did Joanna visit in May?", "may", "2026-05-01 00:00",
     "2026-06-01 00:00"),
    ("What have I read since March?", "since march", "2026-03-01 00:00", "2026-11-30 15:00"),
])
def test_find_picks_the_longest_expression(sentence: str, expr: str, start: str,
                                           end: str) -> None:
    found = find(sentence, NOW, LISBON)
    assert found is not None and found.text == expr
    assert local(found) == (start, end)


@pytest.mark.parametrize("sentence", [
    "When did Melanie paint a sunrise?",
    "I may go to the market",          # "may" the verb, with no preposition
    "We had 2023 people at the fair",  # a number, not a year
    "The march was long",
    "How long ago was Caroline's 18th birthday?",
    "",
])
def test_find_answers_none_without_a_time(sentence: str) -> None:
    assert find(sentence, NOW, LISBON) is None


@pytest.mark.parametrize(("expr", "says"), [
    ("", "empty"),
    ("   ", "empty"),
    ("blue", "not a time expression"),
    ("31 February 2023", "not a day"),
    ("2023-13", "no month 13"),
    ("since tomorrow", "no time before now"),
    ("morning", "which morning"),
    ("between 15 and 11 August 2023", "before it starts"),
    ("0 days ago", "at least one"),
])
def test_what_is_not_a_time_is_a_clear_error(expr: str, says: str) -> None:
    with pytest.raises(TimeExpressionError, match=says) as err:
        parse(expr, NOW, LISBON)
    assert isinstance(err.value, ValueError)
