"""Read the host's CPU and NUMA lists from /sys/devices/system/{cpu,node} (kernel cpulist format,
"0-15,32-47"). The same code reads the live sysfs and a snapshot copy of these files."""

from __future__ import annotations

from pathlib import Path

from agent.core.host import HostInfo
from agent.core.probed import ParseError

CPU_FILES = ("online", "present", "possible", "offline")
NODE_FILES = ("online", "possible", "has_cpu")


def parse_cpulist(text: str) -> tuple[int, ...]:
    """ "0-3,8,10-11" → (0, 1, 2, 3, 8, 10, 11); "" → (). Raises ParseError on anything else."""
    out: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ParseError(f"not a CPU list: {text.strip()[:80]!r}") from None
        if last < first or last - first > 1 << 16:
            raise ParseError(f"not a CPU list: {text.strip()[:80]!r}")
        out.update(range(first, last + 1))
    return tuple(sorted(out))


def _list(path: Path) -> tuple[int, ...] | None:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return parse_cpulist(text)


def read_host(system_dir: Path) -> HostInfo:
    """system_dir is /sys/devices/system. Raises FileNotFoundError when its cpu folder is missing,
    ParseError when a list is garbled."""
    cpu, node = system_dir / "cpu", system_dir / "node"
    if not cpu.is_dir():
        raise FileNotFoundError(f"{cpu} does not exist")
    return HostInfo(
        cpus_online=_list(cpu / "online"),
        cpus_present=_list(cpu / "present"),
        cpus_possible=_list(cpu / "possible"),
        numa_online=_list(node / "online"),
        numa_with_cpu=_list(node / "has_cpu"),
    )
