"""The base of every closed vocabulary the agent writes (DESIGN.md §4.1): an Event's reason, a
condition's reason, a history entry's action, a hold's reason, a metric's label value. Each is its
own enum, so that handing one vocabulary's word to a function that takes another's fails `mypy`.

A member is its value on the wire: it is a `str`, compares and hashes as its value, and JSON, f-strings,
`str()` and `%s` give the value (not `Name.MEMBER`, the default of a `(str, Enum)` since Python 3.11;
`enum.StrEnum` is 3.11 only, and the agent supports 3.10).
"""

from __future__ import annotations

from enum import Enum


class Vocabulary(str, Enum):
    """A closed set of words the agent writes; subclasses list them (@unique: one word, one name)."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)


__all__ = ["Vocabulary"]
