"""Natural-language time expressions: "last week", "3 months ago", "in April",
"May 2023", "yesterday evening", "2023-05-07" ... as a half-open span of time.

:func:`parse` reads one whole expression; :func:`find` picks the longest time
expression out of a sentence ("What did Caroline do last week?"), or None.
Both read the household's calendar: ``now`` (epoch seconds, from the injected
clock) seen in ``zone``; every span is ``[start, end)`` in epoch seconds, its
bounds local midnights (or local hours for parts of a day), so a day across a
DST change is 23 or 25 hours long.

The span rules (weeks start on Monday, as ISO weeks do):

- ``today``, ``yesterday``, ``tomorrow``, ``the day before yesterday``: that
  calendar day. ``this morning`` / ``afternoon`` / ``evening``, ``tonight``,
  ``yesterday evening``, ``last night``: a part of that day — morning 05-12 h,
  afternoon 12-17 h, evening 17-22 h, night 22 h to 05 h the next morning
  (``tonight`` and ``last night``: evening and night together, 17 h to 05 h).
- ``this`` / ``last`` / ``next`` ``week`` / ``month`` / ``year``: that calendar
  week (Monday to Monday), month or year; ``this weekend`` / ``last weekend``:
  Saturday and Sunday of this week / of last week.
- ``N days|weeks|months|years ago`` (N a number, a number word up to twelve,
  ``a``/``an``, ``a couple of``): the calendar day, week, month or year that
  holds the instant N units before now. "3 months ago" on 2026-11-30 is all of
  August 2026.
- ``the last|past N days|weeks|months|years``: a rolling window ending now,
  ``[now - N units, now)``.
- A month, ``April`` / ``in April``: the most recent April that has begun (the
  current month counts); ``last April``: the most recent April before the
  current month; ``this April``: April of this year; ``next April``: the first
  April after the current month. ``April 2023``, ``2023-04``: that month.
  ``early|beginning of`` / ``mid|middle of`` / ``late|end of`` a month: its days
  1-10 / 11-20 / 21 to the end; ``the first|second|third|fourth|last week of``
  a month: its days 1-7 / 8-14 / 15-21 / 22-28 / its last seven days.
- A season (meteorological, northern hemisphere: spring March-May, summer
  June-August, autumn/fall September-November, winter December to February,
  named by the year of its December): like a month, ``summer`` is the most
  recent that has begun, ``last summer`` the most recent that has ended,
  ``summer 2023`` that one.
- A year, ``2023`` / ``in 2023``: that calendar year.
- A day, ``2023-05-07``, ``7 May 2023``, ``May 7th, 2023``, ``the 7th of
  May``: that day; without a year, the most recent such day not after today.
- A weekday, ``Monday`` / ``on Monday`` / ``last Monday``: the most recent
  Monday before today; ``this Monday``: the Monday of this week; ``next
  Monday``: the first Monday after today.
- Around a day: ``the day|week|weekend before D`` (the day before; the seven
  days before D; the Saturday and Sunday before D), ``the day|week after D``,
  ``the week of D`` (the Monday-to-Monday week holding D), ``the weekend of
  D`` (the Saturday and Sunday of D's week), ``between D1 and D2`` /
  ``from D1 to|until D2`` (both days included; D1 may leave out D2's year).
- ``since X``: from the start of X until now.

Anything else is a :class:`TimeExpressionError` (a ValueError) naming the
expression and the forms understood. When finding an expression inside a
sentence, a bare month, weekday or year counts only behind a preposition
("in May", "on Monday", "during 2023"), so "may" the verb or "2023 people"
are not read as times.
"""

from __future__ import annotations

import calendar
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta, tzinfo

log = logging.getLogger(__name__)

FORMS = ("today, yesterday, this morning, yesterday evening, last night, last week, "
         "this month, 3 months ago, the past 2 weeks, in April, May 2023, last summer, "
         "2023, 2023-05-07, 2023-05, 7 May 2023, last Monday, the week before 16 November "
         "2023, between 11 and 15 August 2023, since March")


class TimeExpressionError(ValueError):
    """An expression that is not a time this module understands."""


@dataclass(frozen=True)
class Span:
    """A half-open stretch of time ``[start, end)`` in epoch seconds, and the
    expression it was read from (lowercased, as matched)."""

    start: float
    end: float
    text: str

    def __contains__(self, when: float) -> bool:
        return self.start <= when < self.end


# -- vocabulary ---------------------------------------------------------------

_MONTHS = {name: i for i, name in enumerate(calendar.month_name) if name}
_MONTH_NAMES = {name.lower(): i for name, i in _MONTHS.items()}
_MONTH_NAMES.update({name.lower()[:3]: i for name, i in _MONTHS.items()})
_MONTH_NAMES["sept"] = 9
_WEEKDAYS = {name.lower(): i for i, name in enumerate(calendar.day_name)}
_NUMBER_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5,
                 "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11,
                 "twelve": 12, "a couple of": 2, "couple of": 2}
_SEASONS = {"spring": 3, "summer": 6, "autumn": 9, "fall": 9, "winter": 12}  # first month
_PARTS = {"morning": (5, 12), "afternoon": (12, 17), "evening": (17, 22), "night": (22, 29)}
_EVENING_AND_NIGHT = (17, 29)
_ORDINAL_WEEKS = {"first": 1, "second": 2, "third": 3, "fourth": 4, "last": 5}
_PREPOSITIONS = ("in", "on", "during", "since", "from", "of", "at", "over", "for", "until",
                 "before", "after", "by")
MAX_YEARS_BACK = 200  # "N years ago" beyond this, or a year before 1800, is refused

_MONTH = "(?:" + "|".join(sorted(_MONTH_NAMES, key=len, reverse=True)) + r")\.?"
_WEEKDAY = "(?:" + "|".join(_WEEKDAYS) + ")"
_NUM = r"(?:\d{1,3}|" + "|".join(sorted(_NUMBER_WORDS, key=len, reverse=True)) + ")"
_YEAR = r"(?:1[89]\d\d|2\d\d\d)"
_DAY = r"(?:[0-3]?\d)(?:st|nd|rd|th)?"
_UNIT = r"(?:day|week|month|year)s?"
_SEASON = "(?:" + "|".join(_SEASONS) + ")"
_PART = "(?:morning|afternoon|evening|night)"
# a day, as text (no groups: compounds capture it whole and read it with _day_of)
_DATE = (rf"(?:\d{{4}}-\d\d-\d\d|{_DAY} (?:of )?{_MONTH}(?: {_YEAR})?"
         rf"|{_MONTH} {_DAY}(?: {_YEAR})?)")


@dataclass(frozen=True)
class _Context:
    today: date
    now: datetime          # naive, local wall time
    zone: tzinfo


Bounds = tuple[datetime, datetime]  # naive local wall times
_Handler = Callable[[re.Match[str], _Context], Bounds]


# -- calendar helpers -------------------------------------------------------------

def _midnight(d: date) -> datetime:
    return datetime(d.year, d.month, d.day)


def _day(d: date) -> Bounds:
    return _midnight(d), _midnight(d + timedelta(days=1))


def _days(first: date, last: date) -> Bounds:
    if last < first:
        raise TimeExpressionError(f"the span ends ({last}) before it starts ({first})")
    return _midnight(first), _midnight(last + timedelta(days=1))


def _week(d: date) -> Bounds:
    monday = d - timedelta(days=d.weekday())
    return _midnight(monday), _midnight(monday + timedelta(days=7))


def _weekend(d: date) -> Bounds:
    """The Saturday and Sunday of ``d``'s week."""
    saturday = d - timedelta(days=d.weekday()) + timedelta(days=5)
    return _midnight(saturday), _midnight(saturday + timedelta(days=2))


def _month(year: int, month: int) -> Bounds:
    _check_year(year)
    start = datetime(year, month, 1)
    return start, _add_months(start, 1)


def _year(year: int) -> Bounds:
    _check_year(year)
    return datetime(year, 1, 1), datetime(year + 1, 1, 1)


def _season(year: int, first_month: int) -> Bounds:
    _check_year(year)
    start = datetime(year, first_month, 1)
    return start, _add_months(start, 3)


def _add_months(dt: datetime, months: int) -> datetime:
    index = dt.year * 12 + dt.month - 1 + months
    year, month = divmod(index, 12)
    day = min(dt.day, calendar.monthrange(year, month + 1)[1])
    return dt.replace(year=year, month=month + 1, day=day)


def _check_year(year: int) -> None:
    if not 1800 <= year <= 9998:
        raise TimeExpressionError(f"year {year} is out of range (1800-9998)")


def _number(text: str) -> int:
    text = " ".join(text.split())
    value = _NUMBER_WORDS[text] if text in _NUMBER_WORDS else int(text)
    if value < 1:
        raise TimeExpressionError(f"{text!r} is not a count of at least one")
    return value


def _month_of(text: str) -> int:
    return _MONTH_NAMES[text.rstrip(".")]


def _day_number(text: str) -> int:
    return int(re.sub(r"(st|nd|rd|th)$", "", text))


def _make_date(year: int, month: int, day: int) -> date:
    _check_year(year)
    try:
        return date(year, month, day)
    except ValueError:
        raise TimeExpressionError(f"{year}-{month:02d}-{day:02d} is not a day") from None


def _dated(month: int, day: int, year: int | None, today: date) -> date:
    """A day; without a year, the most recent one not after today."""
    if year is not None:
        return _make_date(year, month, day)
    found = _make_date(today.year, month, day) if not (month == 2 and day == 29) else None
    if found is None or found > today:
        for back in range(1, 9):  # 29 February waits for a leap year
            try:
                return date(today.year - back, month, day)
            except ValueError:
                continue
        raise TimeExpressionError(f"no day {month}-{day}")
    return found


_DATE_FORMS = (
    re.compile(r"(?P<y>\d{4})-(?P<m>\d\d)-(?P<d>\d\d)"),
    re.compile(rf"(?P<d>{_DAY}) (?:of )?(?P<mn>{_MONTH})(?: (?P<y>{_YEAR}))?"),
    re.compile(rf"(?P<mn>{_MONTH}) (?P<d>{_DAY})(?: (?P<y>{_YEAR}))?"),
)


def _day_of(text: str, today: date, default_year: int | None = None) -> date:
    """The day ``text`` (one of the _DATE forms) names."""
    for form in _DATE_FORMS:
        m = form.fullmatch(text)
        if m is None:
            continue
        groups = m.groupdict()
        month = int(groups["m"]) if groups.get("m") else _month_of(groups["mn"])
        if not 1 <= month <= 12:
            raise TimeExpressionError(f"{text!r}: no month {month}")
        year = int(groups["y"]) if groups.get("y") else default_year
        return _dated(month, _day_number(groups["d"]), year, today)
    raise TimeExpressionError(f"{text!r} is not a day")


def _recent_month(month: int, ctx: _Context, *, strictly_past: bool = False) -> Bounds:
    """The most recent ``month`` that has begun (or, strictly, that has ended)."""
    year = ctx.today.year
    current = (month == ctx.today.month)
    if month > ctx.today.month or (strictly_past and current):
        year -= 1
    return _month(year, month)


def _season_year_bounds(first_month: int, ctx: _Context, which: str) -> Bounds:
    this_year = _season(ctx.today.year, first_month)
    now = ctx.now
    if which == "this":
        if first_month == 12 and now < datetime(ctx.today.year, 3, 1):
            return _season(ctx.today.year - 1, first_month)  # this winter: the current one
        return this_year
    if which == "next":
        start = this_year if this_year[0] > now else _season(ctx.today.year + 1, first_month)
        return start
    # the most recent that has begun, or (last) that has ended
    year = ctx.today.year
    while True:
        bounds = _season(year, first_month)
        if (bounds[1] <= now) if which == "last" else (bounds[0] <= now):
            return bounds
        year -= 1


# -- the rules ------------------------------------------------------------------

_rules: list[tuple[re.Pattern[str], _Handler, bool]] = []


def _rule(pattern: str, bare: bool = False) -> Callable[[_Handler], _Handler]:
    """Register a handler for ``pattern``; ``bare``: inside a sentence it only
    counts behind a preposition."""
    def register(fn: _Handler) -> _Handler:
        _rules.append((re.compile(pattern), fn, bare))
        return fn
    return register


@_rule(r"(?P<w>today|yesterday|tomorrow|the day before yesterday|the day after tomorrow)")
def _named_day(m: re.Match[str], ctx: _Context) -> Bounds:
    shift = {"today": 0, "yesterday": -1, "tomorrow": 1, "the day before yesterday": -2,
             "the day after tomorrow": 2}[m["w"]]
    return _day(ctx.today + timedelta(days=shift))


@_rule(rf"(?:(?P<which>this|yesterday|tomorrow|today) )?(?P<part>{_PART})"
       rf"|(?P<word>tonight|last night)")
def _part_of_day(m: re.Match[str], ctx: _Context) -> Bounds:
    if m["word"] is not None:
        base = ctx.today - timedelta(days=1 if m["word"] == "last night" else 0)
        first, last = _EVENING_AND_NIGHT
    else:
        if m["which"] is None:
            raise TimeExpressionError(f"{m[0]!r}: which {m['part']}? (this {m['part']}, "
                                      f"yesterday {m['part']})")
        shift = {None: 0, "this": 0, "today": 0, "yesterday": -1, "tomorrow": 1}[m["which"]]
        base = ctx.today + timedelta(days=shift)
        first, last = _PARTS[m["part"]]
    start = _midnight(base)
    return start + timedelta(hours=first), start + timedelta(hours=last)


@_rule(r"(?P<which>this|last|next|the previous|previous) (?P<unit>week|weekend|month|year)")
def _this_unit(m: re.Match[str], ctx: _Context) -> Bounds:
    step = {"this": 0, "last": -1, "previous": -1, "the previous": -1, "next": 1}[m["which"]]
    unit = m["unit"]
    if unit == "week":
        return _week(ctx.today + timedelta(weeks=step))
    if unit == "weekend":
        return _weekend(ctx.today + timedelta(weeks=step))
    if unit == "month":
        start = _add_months(datetime(ctx.today.year, ctx.today.month, 1), step)
        return start, _add_months(start, 1)
    return _year(ctx.today.year + step)


@_rule(rf"(?P<n>{_NUM}) (?P<unit>{_UNIT}) ago")
def _ago(m: re.Match[str], ctx: _Context) -> Bounds:
    n, unit = _number(m["n"]), m["unit"].rstrip("s")
    if unit == "day":
        return _day(ctx.today - timedelta(days=n))
    if unit == "week":
        return _week(ctx.today - timedelta(weeks=n))
    if unit == "month":
        start = _add_months(datetime(ctx.today.year, ctx.today.month, 1), -n)
        return start, _add_months(start, 1)
    if n > MAX_YEARS_BACK:
        raise TimeExpressionError(f"{m[0]!r} is too far back")
    return _year(ctx.today.year - n)


@_rule(rf"(?:the )?(?:last|past|previous) (?P<n>{_NUM}) (?P<unit>{_UNIT})")
def _rolling(m: re.Match[str], ctx: _Context) -> Bounds:
    n, unit = _number(m["n"]), m["unit"].rstrip("s")
    if unit == "day":
        return ctx.now - timedelta(days=n), ctx.now
    if unit == "week":
        return ctx.now - timedelta(weeks=n), ctx.now
    months = n if unit == "month" else 12 * n
    if months > 12 * MAX_YEARS_BACK:
        raise TimeExpressionError(f"{m[0]!r} is too far back")
    return _add_months(ctx.now, -months), ctx.now


@_rule(rf"(?P<y>{_YEAR})-(?P<m>\d\d)")
def _iso_month(m: re.Match[str], ctx: _Context) -> Bounds:
    month = int(m["m"])
    if not 1 <= month <= 12:
        raise TimeExpressionError(f"{m[0]!r}: no month {month}")
    return _month(int(m["y"]), month)


@_rule(rf"(?P<mn>{_MONTH}) (?:of )?(?P<y>{_YEAR})")
def _month_year(m: re.Match[str], ctx: _Context) -> Bounds:
    return _month(int(m["y"]), _month_of(m["mn"]))


@_rule(rf"(?P<mn>{_MONTH})", bare=True)
def _bare_month(m: re.Match[str], ctx: _Context) -> Bounds:
    return _recent_month(_month_of(m["mn"]), ctx)


@_rule(rf"(?P<which>last|this|next) (?P<mn>{_MONTH})")
def _which_month(m: re.Match[str], ctx: _Context) -> Bounds:
    month = _month_of(m["mn"])
    if m["which"] == "last":
        return _recent_month(month, ctx, strictly_past=True)
    if m["which"] == "this":
        return _month(ctx.today.year, month)
    year = ctx.today.year + (1 if month <= ctx.today.month else 0)
    return _month(year, month)


def _month_in_context(mn: str, year: str | None, ctx: _Context) -> Bounds:
    month = _month_of(mn)
    return _month(int(year), month) if year else _recent_month(month, ctx)


@_rule(rf"(?:the )?(?P<part>early|beginning of|the beginning of|start of|the start of"
       rf"|mid|mid-|middle of|the middle of|late|end of|the end of) ?(?P<mn>{_MONTH})"
       rf"(?: (?P<y>{_YEAR}))?")
def _part_of_month(m: re.Match[str], ctx: _Context) -> Bounds:
    start, end = _month_in_context(m["mn"], m["y"], ctx)
    part = m["part"].removeprefix("the ")
    if part in ("early", "beginning of", "start of"):
        return start, start + timedelta(days=10)
    if part in ("mid", "mid-", "middle of"):
        return start + timedelta(days=10), start + timedelta(days=20)
    return start + timedelta(days=20), end


@_rule(rf"(?:the )?(?P<nth>first|second|third|fourth|last) week of (?P<mn>{_MONTH})"
       rf"(?: (?P<y>{_YEAR}))?")
def _week_of_month(m: re.Match[str], ctx: _Context) -> Bounds:
    start, end = _month_in_context(m["mn"], m["y"], ctx)
    nth = _ORDINAL_WEEKS[m["nth"]]
    if nth == 5:
        return end - timedelta(days=7), end
    return start + timedelta(days=7 * (nth - 1)), start + timedelta(days=7 * nth)


@_rule(rf"(?:(?P<which>last|this|next) )?(?P<s>{_SEASON})(?: (?:of )?(?P<y>{_YEAR}))?")
def _season_rule(m: re.Match[str], ctx: _Context) -> Bounds:
    first = _SEASONS[m["s"]]
    if m["y"] is not None:
        if m["which"] is not None:
            raise TimeExpressionError(f"{m[0]!r}: either {m['which']} or a year, not both")
        return _season(int(m["y"]), first)
    return _season_year_bounds(first, ctx, m["which"] or "recent")


@_rule(rf"(?:the year )?(?P<y>{_YEAR})", bare=True)
def _year_rule(m: re.Match[str], ctx: _Context) -> Bounds:
    return _year(int(m["y"]))


@_rule(rf"(?P<d>{_DATE})")
def _date_rule(m: re.Match[str], ctx: _Context) -> Bounds:
    return _day(_day_of(m["d"], ctx.today))


@_rule(rf"(?:the )?(?P<d>{_DAY}) of (?P<mn>{_MONTH})")
def _nth_of_month(m: re.Match[str], ctx: _Context) -> Bounds:
    return _day(_dated(_month_of(m["mn"]), _day_number(m["d"]), None, ctx.today))


@_rule(rf"(?P<which>last|this|next) (?P<wd>{_WEEKDAY})")
def _which_weekday(m: re.Match[str], ctx: _Context) -> Bounds:
    return _weekday(_WEEKDAYS[m["wd"]], m["which"], ctx)


@_rule(rf"(?P<wd>{_WEEKDAY})", bare=True)
def _bare_weekday(m: re.Match[str], ctx: _Context) -> Bounds:
    return _weekday(_WEEKDAYS[m["wd"]], "last", ctx)


def _weekday(weekday: int, which: str, ctx: _Context) -> Bounds:
    today = ctx.today
    if which == "this":
        return _day(today - timedelta(days=today.weekday() - weekday))
    if which == "next":
        return _day(today + timedelta(days=(weekday - today.weekday() - 1) % 7 + 1))
    return _day(today - timedelta(days=(today.weekday() - weekday - 1) % 7 + 1))


@_rule(rf"(?:the )?(?P<unit>day|week|weekend) (?P<rel>before|after|of) (?P<d>{_DATE})")
def _around_day(m: re.Match[str], ctx: _Context) -> Bounds:
    d = _day_of(m["d"], ctx.today)
    unit, rel = m["unit"], m["rel"]
    if rel == "of":
        if unit == "day":
            return _day(d)
        return _week(d) if unit == "week" else _weekend(d)
    if unit == "day":
        return _day(d + timedelta(days=-1 if rel == "before" else 1))
    if unit == "week":
        return ((_midnight(d - timedelta(days=7)), _midnight(d)) if rel == "before"
                else (_midnight(d + timedelta(days=1)), _midnight(d + timedelta(days=8))))
    # the weekend before (after) d: the Saturday and Sunday wholly before (after) it
    if rel == "before":
        sunday = d - timedelta(days=(d.weekday() - 6 - 1) % 7 + 1)
        return _midnight(sunday - timedelta(days=1)), _midnight(sunday + timedelta(days=1))
    saturday = d + timedelta(days=(5 - d.weekday() - 1) % 7 + 1)
    return _midnight(saturday), _midnight(saturday + timedelta(days=2))


@_rule(rf"(?:between|from) (?P<a>{_DATE}|{_DAY}) (?:and|to|until|till) (?P<b>{_DATE})")
def _between(m: re.Match[str], ctx: _Context) -> Bounds:
    last = _day_of(m["b"], ctx.today)
    a = m["a"]
    if re.fullmatch(_DAY, a):  # "between 11 and 15 August 2023"
        first = _make_date(last.year, last.month, _day_number(a))
    else:
        first = _day_of(a, ctx.today, default_year=last.year)
    return _days(first, last)


# -- public ---------------------------------------------------------------------

_SPACES = re.compile(r"\s+")
_STRIP = re.compile(r"[,;!?\"“”()\[\]]")
_LEADING = re.compile(r"^(?:(?:in|on|during|at|over|for|around) )+")


def normalise(text: str) -> str:
    """Lowercase, commas and brackets as spaces, one space between words, no
    closing full stop."""
    text = _STRIP.sub(" ", text.lower())
    text = re.sub(r"(?<=[a-z])\.(?=\s|$)", " ", text)  # "Aug. 2023", a closing full stop
    return _SPACES.sub(" ", text).strip()


def parse(expr: str, now: float, zone: tzinfo) -> Span:
    """The span ``expr`` names, read at ``now`` in ``zone`` (see the module
    docstring for the rules). TimeExpressionError if it names none."""
    text = normalise(expr)
    if not text:
        raise TimeExpressionError("an empty time expression: expected one such as " + FORMS)
    ctx = _context(now, zone)
    since = text.startswith("since ")
    body = _LEADING.sub("", text.removeprefix("since ") if since else text)
    for pattern, handler, _ in _rules:
        m = pattern.fullmatch(body)
        if m is not None:
            return _span(handler(m, ctx), ctx, text, since)
    raise TimeExpressionError(f"{expr.strip()!r} is not a time expression this assistant "
                              f"understands; try one such as {FORMS}")


def find(text: str, now: float, zone: tzinfo) -> Span | None:
    """The longest time expression inside ``text`` and its span, or None when
    there is none (a bare month, weekday or year counts only behind a
    preposition). An expression that looks like a time but is none ("31 February")
    is passed over."""
    norm = normalise(text)
    if not norm:
        return None
    ctx = _context(now, zone)
    found: list[tuple[int, int, str, re.Pattern[str], _Handler]] = []
    for pattern, handler, bare in _rules:
        for m in _finder(pattern).finditer(norm):
            before = norm[:m.start()].split()
            if bare and not (before and before[-1] in _PREPOSITIONS):
                continue
            found.append((m.start(), m.end(), m[0], pattern, handler))
    for start, _, matched, pattern, handler in sorted(found, key=lambda f: (f[0] - f[1], f[0])):
        since = norm[:start].split()[-1:] == ["since"]
        whole = pattern.fullmatch(matched)
        if whole is None:
            continue
        try:
            return _span(handler(whole, ctx), ctx, ("since " if since else "") + matched,
                         since)
        except TimeExpressionError:
            continue
    return None


_finders: dict[re.Pattern[str], re.Pattern[str]] = {}


def _finder(pattern: re.Pattern[str]) -> re.Pattern[str]:
    compiled = _finders.get(pattern)
    if compiled is None:
        compiled = _finders[pattern] = re.compile(
            r"(?<![\w-])(?:" + pattern.pattern + r")(?![\w-])")
    return compiled


def _context(now: float, zone: tzinfo) -> _Context:
    local = datetime.fromtimestamp(now, tz=zone)
    return _Context(today=local.date(), now=local.replace(tzinfo=None), zone=zone)


def _span(bounds: Bounds, ctx: _Context, text: str, since: bool) -> Span:
    start, end = bounds
    start_ts = _epoch(start, ctx.zone)
    end_ts = _epoch(ctx.now, ctx.zone) if since else _epoch(end, ctx.zone)
    if end_ts <= start_ts:
        raise TimeExpressionError(f"{text!r} names no time before now" if since
                                  else f"{text!r} is an empty span")
    return Span(start=start_ts, end=end_ts, text=text)


def _epoch(local: datetime, zone: tzinfo) -> float:
    return local.replace(tzinfo=zone).timestamp()
