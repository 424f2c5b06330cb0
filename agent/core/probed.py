"""The typed "could not read" that every probe returns instead of raising, and the line of a tool's
output a value was read from (its evidence)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TypeVar, Union


class ProbeErrorKind(str, enum.Enum):
    TIMEOUT = "timeout"  # the tool hung past its timeout and was killed
    TOOL_FAILED = "tool-failed"  # the tool ran and reported an error (exit code, error text)
    UNREADABLE = "unreadable"  # output/file exists but is malformed, truncated or garbage
    UNAVAILABLE = "unavailable"  # the tool, library, device file or endpoint is not there


@dataclass(frozen=True)
class ProbeError:
    """We could not look. `source` names what we tried ("nvidia-smi -q -x", "kmsg.log").

    `partial` is the part of an unreadable capture that was read intact (the complete GPU blocks of
    a cut `nvidia-smi -q`), of the type a full read gives: a fault it states plainly is still
    reported, while everything it cannot show stays unknown."""

    source: str
    kind: ProbeErrorKind
    message: str
    partial: object | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return f"{self.source}: {self.kind.value}: {self.message}"


@dataclass(frozen=True)
class NotCaptured:
    """A snapshot that does not hold this input: checks that need it are skipped."""

    source: str

    def __str__(self) -> str:
        return f"{self.source} not captured"


T = TypeVar("T")
Probed = Union[T, ProbeError, NotCaptured]


class ParseError(ValueError):
    """Raised inside parsers; probes turn it into ProbeError(UNREADABLE), keeping `partial` (what
    was read intact before the input stopped making sense) as ProbeError.partial."""

    def __init__(self, message: str, partial: object | None = None) -> None:
        super().__init__(message)
        self.partial = partial


@dataclass(frozen=True)
class SourceLine:
    """A line of a tool's output that a value was read from (1-based), kept as evidence."""

    line: int
    text: str
