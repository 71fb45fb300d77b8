"""Cron expressions: when a schedule (actors/schedules.py) starts its runs.

Five fields, `minute hour day-of-month month day-of-week`, or six with `second` first (as
Quartz, and DBOS's scheduled workflows, read them). Each field is `*`, a value, a range `a-b`,
any of those with a step (`*/5`, `10-50/20`), or a comma list of them; months and weekdays may be
named (`JAN`, `MON`; Sunday is 0 or 7). As in cron, when both the day of the month and the day of
the week are restricted, a day matching either matches. Also `@yearly`, `@monthly`, `@weekly`,
`@daily`, `@hourly`. Times are in the schedule's time zone (UTC unless it names one).
"""
from __future__ import annotations

import datetime
import math
import zoneinfo

MACROS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
          "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}
MONTHS = {name: i + 1 for i, name in enumerate("JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split())}
DAYS = {name: i for i, name in enumerate("SUN MON TUE WED THU FRI SAT".split())}
# (name, lowest, highest, names) of each field, seconds first
FIELDS = (("second", 0, 59, {}), ("minute", 0, 59, {}), ("hour", 0, 23, {}), ("day of month", 1, 31, {}),
          ("month", 1, 12, MONTHS), ("day of week", 0, 7, DAYS))
SEARCH_STEPS = 200_000   # of the search for the next time: past it, the expression never matches
MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)   # the most each month has


class CronError(ValueError):
    pass


def _value(text: str, field: tuple) -> int:
    name, low, high, names = field
    value = names.get(text.upper()) if not text.isdigit() else int(text)
    if value is None or not low <= value <= high:
        raise CronError(f"{name}: {text!r} is not a value from {low} to {high}")
    return value


def _field(text: str, field: tuple) -> frozenset[int]:
    name, low, high, _ = field
    out: set[int] = set()
    for part in text.split(","):
        span, _, step_text = part.partition("/")
        if step_text and not (step_text.isdigit() and int(step_text) > 0):
            raise CronError(f"{name}: the step in {part!r} is not a number above 0")
        step = int(step_text) if step_text else 1
        if span == "*":
            first, last = low, high
        elif "-" in span:
            a, _, b = span.partition("-")
            first, last = _value(a, field), _value(b, field)
            if first > last:
                raise CronError(f"{name}: the range {span!r} runs backwards")
        else:
            first = _value(span, field)
            last = high if step_text else first
        out.update(range(first, last + 1, step))
    return frozenset(out)


class Cron:
    """A parsed expression; `next_after(t)` is its first time (epoch seconds, whole) after t."""

    def __init__(self, expression: str, timezone: str = "UTC") -> None:
        if not isinstance(expression, str) or not expression.strip():
            raise CronError("a cron expression is five fields (minute hour day month weekday), or six with seconds")
        text = MACROS.get(expression.strip().lower(), expression.strip())
        parts = text.split()
        if len(parts) == 5:
            parts = ["0", *parts]
        if len(parts) != 6:
            raise CronError(f"{expression!r} has {len(parts)} fields; a cron expression has 5, or 6 with seconds")
        sets = [_field(p, f) for p, f in zip(parts, FIELDS)]
        self.seconds, self.minutes, self.hours, self.days, self.months, weekdays = sets
        self.weekdays = frozenset(d % 7 for d in weekdays)
        self.any_day, self.any_weekday = parts[3] in ("*", "?"), parts[5] in ("*", "?")
        try:
            self.zone = zoneinfo.ZoneInfo(timezone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError):
            raise CronError(f"{timezone!r} is not a time zone this machine knows (as 'UTC' or 'Europe/Berlin')") \
                from None
        # Days of the month no month it names has (Feb 30, Apr 31), and any weekday: said at once.
        # The search found it out too, but only at its end: 0.3-0.9 s of CPU on the gateway's
        # loop for each PUT of such a schedule, every other request waiting.
        if not self.any_day and self.any_weekday and all(min(self.days) > MONTH_DAYS[m - 1] for m in self.months):
            raise CronError(f"{expression!r} matches no time")
        if self.next_after(datetime.datetime(2000, 1, 1, tzinfo=datetime.timezone.utc).timestamp()) is None:
            raise CronError(f"{expression!r} matches no time")

    def _day_ok(self, t: datetime.datetime) -> bool:
        weekday = (t.weekday() + 1) % 7   # Sunday 0
        if self.any_day or self.any_weekday:
            return t.day in self.days and weekday in self.weekdays
        return t.day in self.days or weekday in self.weekdays

    def next_after(self, after: float) -> float | None:
        """The first whole second past `after` that the expression matches; None if there is
        none within the search (an expression like Feb 30)."""
        start = math.floor(after) + 1
        try:
            return self._search(start)
        except OverflowError:   # past the year 9999
            return None

    def _search(self, start: int) -> float | None:
        t = datetime.datetime.fromtimestamp(start, self.zone).replace(tzinfo=None)
        for _ in range(SEARCH_STEPS):
            if t.month not in self.months:
                t = (t.replace(day=1) + datetime.timedelta(days=32)).replace(day=1, hour=0, minute=0, second=0)
            elif not self._day_ok(t):
                t = (t + datetime.timedelta(days=1)).replace(hour=0, minute=0, second=0)
            elif t.hour not in self.hours:
                t = (t + datetime.timedelta(hours=1)).replace(minute=0, second=0)
            elif t.minute not in self.minutes:
                t = (t + datetime.timedelta(minutes=1)).replace(second=0)
            elif t.second not in self.seconds:
                t += datetime.timedelta(seconds=1)
            else:
                at = t.replace(tzinfo=self.zone).timestamp()
                if at >= start:   # (a wall time the clocks went back over is not taken twice)
                    return at
                t += datetime.timedelta(seconds=1)
        return None

    def times_in(self, low: float, high: float, most: int) -> list[float]:
        """Its times in [low, high], in order: the latest `most` of them. Looked for in windows
        ending at `high` that grow until one holds `most` (or reaches `low`): a few searches for a
        window of days, where walking every time of an every-second expression from `low` would
        take seconds."""
        span = 1.0
        while True:
            start = max(low, high - span)
            found = []
            at = self.next_after(math.ceil(start) - 1)
            while at is not None and at <= high:
                found.append(at)
                at = self.next_after(at)
            if len(found) >= most or start <= low:
                return found[-most:]
            span *= 4
