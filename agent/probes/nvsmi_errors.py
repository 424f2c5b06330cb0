"""What NVIDIA's tools print instead of data when they fail, recognised so that a failing tool is
reported as a failing tool (or a lost GPU), never as "unreadable output"."""

from __future__ import annotations

import re

from agent.core.gpu import LostGpu
from agent.core.pci import normalize_pci
from agent.core.probed import SourceLine


class ToolReportedFailure(Exception):
    """nvidia-smi / NVML said, in its own words, that it cannot work (driver not loaded, version
    mismatch). A node/driver fault, not a parse problem: probes map it to ProbeErrorKind.TOOL_FAILED."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NvmlUnavailable(Exception):
    """NVML itself cannot be loaded here (no pynvml, no libnvidia-ml.so in this container): we could
    not look through NVML, which says nothing about the GPUs. Callers fall back to nvidia-smi."""


class ProbeTimeout(Exception):
    """A live NVML read did not finish in time (NVML calls can hang on a dying GPU)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# Whole-output failures: nvidia-smi prints one of these (to stdout or stderr) and no data at all.
_FAILURE_OPENINGS = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver",
    "Failed to initialize NVML:",
    "NVML library version:",
    "Unable to load the NVIDIA Management Library",
    "NVIDIA-SMI couldn't find libnvidia-ml.so library",
    "Driver/library version mismatch",
)
# Each opening to the end of its line, in any case. The folded opening is looked for first: a plain
# substring search, where six case-blind regex scans of a healthy 8-GPU `-q` cost ~20 ms a read.
_FAILURE_PATTERNS = tuple(
    (opening.casefold(), re.compile(re.escape(opening) + r"[^\n]*", re.I)) for opening in _FAILURE_OPENINGS
)

_NO_DEVICES = re.compile(r"^\s*No devices were found\s*$", re.I | re.M)

# "Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error"
# "Unable to determine the device handle for GPU 0000:3B:00.0: GPU is lost.  Reboot the system ..."
_LOST = re.compile(
    r"Unable to determine the device handle for (?:GPU|gpu)\s*"
    r"(?P<pci>(?:[0-9A-Fa-f]{1,8}:)?[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}\.[0-9A-Fa-f])?\s*:?\s*(?P<why>[^\n]*)"
)


def detect_tool_failure(text: str) -> str | None:
    """The failure sentence(s) nvidia-smi printed instead of data, or None.

    Several matching lines (e.g. "Failed to initialize NVML: Driver/library version mismatch" then
    "NVML library version: 535.161") are joined with "; ".
    """
    found: list[tuple[int, str]] = []
    folded = text.casefold()
    for opening, pattern in _FAILURE_PATTERNS:
        if opening not in folded:
            continue
        for match in pattern.finditer(text):
            sentence = " ".join(match.group(0).split())
            if not any(start <= match.start() < start + len(s) for start, s in found):
                found.append((match.start(), sentence))
    if not found:
        return None
    found.sort()
    return "; ".join(s for _, s in found)


def detect_no_devices(text: str) -> bool:
    """nvidia-smi's "No devices were found": the driver works and sees no GPU. That is data (zero
    GPUs, judged against the instance profile), not a parse failure."""
    return _NO_DEVICES.search(text) is not None


def is_lost_gpu_line(line: str) -> bool:
    return _LOST.search(line) is not None


def detect_lost_gpus(text: str) -> list[LostGpu]:
    """One LostGpu per "Unable to determine the device handle for GPU…" line, in order."""
    lost: list[LostGpu] = []
    for match in _LOST.finditer(text):
        pci = match.group("pci")
        line_start = text.rfind("\n", 0, match.start()) + 1
        line_end = text.find("\n", match.end())
        line = text[line_start : line_end if line_end >= 0 else len(text)]
        lost.append(
            LostGpu(
                pci_bus_id=normalize_pci(pci) if pci else None,
                message=" ".join(line.split()),
                where=SourceLine(text.count("\n", 0, line_start) + 1, line.strip()),
            )
        )
    return lost


def with_lost_lines(output: str, other: str) -> str:
    """`output` with the lost-GPU lines of `other` (stderr, or another view of nvidia-smi) that it
    does not already hold appended, so that its parser counts those GPUs as lost, not missing."""
    known = {lost.pci_bus_id for lost in detect_lost_gpus(output)}
    extra = [lost.message for lost in detect_lost_gpus(other) if lost.pci_bus_id not in known]
    if not extra:
        return output
    return output + ("" if output.endswith("\n") else "\n") + "\n".join(extra) + "\n"


def other_text(text: str) -> str | None:
    """The first line that is neither blank, nor a lost-GPU line, nor "No devices were found": an
    output that holds one besides those is not what nvidia-smi prints when it has no GPU to show."""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not is_lost_gpu_line(stripped) and not _NO_DEVICES.match(stripped):
            return stripped
    return None
