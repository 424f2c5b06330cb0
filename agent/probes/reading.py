"""What both sources (probes/live.py, probes/snapshot.py) read with: a parser run into a Probed
value (never an exception), a memo that re-parses only changed text, and the sysfs trees and the
kernel log as Probed values. Both sources hand the same parsers the same text, so a snapshot
replays exactly what the live node showed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from agent.core.host import HostInfo
from agent.core.kernel import KernelXids
from agent.core.pci import PciSample
from agent.core.probed import NotCaptured, ParseError, Probed, ProbeError, ProbeErrorKind
from agent.core.rdma import RdmaSample
from agent.probes.host import read_host
from agent.probes.kernel_tail import BinaryLog, KernelTail
from agent.probes.nvsmi_errors import ToolReportedFailure
from agent.probes.pci import read_pci
from agent.probes.rdma import read_rdma

T = TypeVar("T")


def parse_with(source: str, text: str | ProbeError | NotCaptured, parser: Callable[[str], T]) -> Probed[T]:
    """Run a parser, turning its typed failures into ProbeErrors (never an exception)."""
    if isinstance(text, (ProbeError, NotCaptured)):
        return text
    try:
        return parser(text)
    except ToolReportedFailure as exc:
        return ProbeError(source, ProbeErrorKind.TOOL_FAILED, str(exc))
    except ParseError as exc:
        return ProbeError(source, ProbeErrorKind.UNREADABLE, str(exc) or "malformed output", exc.partial)


class ParseMemo:
    """Re-parse a tool's output only when its text changed: in steady state a snapshot's files (and
    most live outputs) are identical from one tick to the next. Parsed values are immutable."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[str, object]] = {}

    def parse(
        self, source: str, text: str | ProbeError | NotCaptured, parser: Callable[[str], T]
    ) -> Probed[T]:
        if not isinstance(text, str):
            self._last.pop(source, None)
            return text
        hit = self._last.get(source)
        if hit is not None and hit[0] == text:
            return hit[1]  # type: ignore[return-value]
        value = parse_with(source, text, parser)
        self._last[source] = (text, value)
        return value


def read_rdma_tree(class_dir: Path, pci_dir: Path) -> Probed[RdmaSample]:
    """An RDMA sysfs tree as a Probed value: a class directory gone in the meantime is not captured."""
    try:
        return read_rdma(class_dir, pci_dir if pci_dir.is_dir() else None)
    except FileNotFoundError:
        return NotCaptured(str(class_dir))
    except OSError as exc:
        return ProbeError(str(class_dir), ProbeErrorKind.UNREADABLE, exc.strerror or str(exc))


def read_kernel_tail(tail: KernelTail, name: str) -> Probed[KernelXids]:
    """The kernel log's view, or why it cannot be read. With a follower running, the follower is the
    reader (the engine must not parse a storm's backlog before it can judge the line that woke it);
    without one (`check`, tests), what is new is read now."""
    try:
        if not tail.followed:
            tail.poll()
        elif tail.error is not None:
            raise tail.error
    except FileNotFoundError:
        tail.forget()
        return NotCaptured(name)
    except BinaryLog as exc:
        tail.forget()
        return ProbeError(name, ProbeErrorKind.UNREADABLE, str(exc))
    except PermissionError:
        return ProbeError(name, ProbeErrorKind.UNAVAILABLE, "permission denied (needs CAP_SYSLOG)")
    except OSError as exc:
        return ProbeError(name, ProbeErrorKind.UNREADABLE, exc.strerror or str(exc))
    return tail.view()


def read_pci_tree(devices_dir: Path) -> Probed[PciSample]:
    """/sys/bus/pci/devices as a Probed value: a node without it cannot say what is on its bus."""
    try:
        return read_pci(devices_dir)
    except FileNotFoundError:
        return ProbeError(str(devices_dir), ProbeErrorKind.UNAVAILABLE, "not present (mount /sys)")
    except OSError as exc:
        return ProbeError(str(devices_dir), ProbeErrorKind.UNREADABLE, exc.strerror or str(exc))


def read_host_tree(system_dir: Path) -> Probed[HostInfo]:
    """/sys/devices/system as a Probed value."""
    try:
        return read_host(system_dir)
    except FileNotFoundError:
        return ProbeError(str(system_dir / "cpu"), ProbeErrorKind.UNAVAILABLE, "not present (mount /sys)")
    except ParseError as exc:
        return ProbeError(str(system_dir), ProbeErrorKind.UNREADABLE, str(exc))
