"""Times as `gpu-healthcheck status` shows them: the age of an RFC 3339 stamp, in one short word."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any


def parse_time(text: Any) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)


def seconds_since(when: Any, now: datetime) -> int | None:
    t = parse_time(when)
    return None if t is None else max(0, int((now - t).total_seconds()))


def human(secs: int) -> str:
    """ "42s", "7m", "3h", "2d"."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size * (2 if unit != "m" else 1):
            return f"{secs // size}{unit}"
    return f"{secs}s"


def age(checked_at: Any, now: datetime) -> str:
    """ "42s", "7m", "3h", "2d" since an RFC 3339 time; "-" when missing or unreadable."""
    secs = seconds_since(checked_at, now)
    return "-" if secs is None else human(secs)


__all__ = ["age", "human", "parse_time", "seconds_since"]
