"""Parse `nvidia-smi nvlink -s` / `--status`: per-GPU link speeds, the input of the NVLink check.

Shapes seen in real output:
  GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)      a GPU header
  \t Link 0: 26.562 GB/s                             an active link
  \t Link 3: <inactive>                              an inactive link
  NVML: Unable to retrieve NVLink information as all links are inactive
  Device does not have or support Nvlink             (GPU without NVLink, e.g. L40S)
  Nvlink queries are not supported for Devices in MIG mode
and an empty output on GPUs without NVLink (A10).
"""

from __future__ import annotations

import re

from agent.core.nvlink import NvlinkGpu, NvlinkReport
from agent.core.probed import ParseError, SourceLine

_GPU = re.compile(r"^GPU\s+(\d+)\s*:\s*(.*?)\s*(?:\(UUID:\s*([^)]*?)\s*\))?\s*$")
_LINK = re.compile(r"^Link\s+(\d+)\s*:\s*(.*?)\s*$")
_SPEED = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*GB/s$", re.IGNORECASE)
_ALL_INACTIVE = re.compile(r"all links are inactive", re.IGNORECASE)
_NOT_SUPPORTED = re.compile(r"does not have or support nvlink|nvlink is not supported", re.IGNORECASE)
_MIG = re.compile(r"not supported for devices in MIG mode", re.IGNORECASE)
# Control characters other than tab, and U+FFFD (bytes that were not UTF-8): never in nvidia-smi's
# output. A GPU whose lines hold one is damaged (a NUL in its UUID would make it another GPU).
_GARBLED = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd]")


_INACTIVE = "<inactive>"


class _Builder:
    def __init__(self, index: int, name: str | None, uuid: str | None, line: int) -> None:
        self.index = index
        self.name = name
        self.uuid = uuid
        self.line = line
        self.links: dict[int, float | None] = {}
        self.all_inactive = False
        self.no_nvlink = False
        self.unavailable: str | None = None
        self.damage: str | None = None  # why this GPU's block cannot be trusted
        self.where: list[SourceLine] = []  # its header and the lines that state a fault

    def damaged(self, why: str) -> None:
        self.damage = self.damage or why

    def build(self) -> NvlinkGpu:
        return NvlinkGpu(
            index=self.index,
            name=self.name,
            uuid=self.uuid,
            links=dict(self.links),
            all_inactive=self.all_inactive,
            unavailable=self.unavailable,
            where=tuple(self.where),
        )


def _speed(text: str) -> float | None:
    """ "26.562 GB/s" → 26.562, "<inactive>" → None; ValueError for anything else (a cut "26.5",
    a cut "<inact"): a value we cannot read is never an inactive link."""
    m = _SPEED.match(text)
    if m:
        return float(m.group(1))
    if text.lower() == _INACTIVE:
        return None
    raise ValueError(text)


def _complete(last: str) -> bool:
    """Whether a last line without its newline is whole by the listing's grammar: a GPU header that
    closes its "(UUID: ...)" (nvidia-smi prints one on every header), a link whose value is a speed
    with its unit or <inactive>, one of the tool's messages. Anything else ("Link 6: 26.5", "<inact",
    "GPU 7: NVIDIA H1") was cut inside."""
    line = last.strip()
    if not line:
        return True
    if _GPU.match(line):
        return line.endswith(")")
    link = _LINK.match(line)
    if link:
        try:
            _speed(link.group(2))
        except ValueError:
            return False
        return True
    return any(p.search(line) for p in (_ALL_INACTIVE, _NOT_SUPPORTED, _MIG))


def parse_nvlink(text: str) -> NvlinkReport:
    """Parse the status listing; ParseError when the text is neither a listing nor a known message,
    or when the listing contradicts itself or stops early (docs/checks.md: "what fails a node, what makes it
    unknown"): a last line cut inside (incomplete by the grammar), a link value that is neither a speed nor
    <inactive>, link numbers that do not run 0, 1, 2... , GPU numbers that do not rise, a GPU that
    lists fewer links than the others. The GPUs whose blocks are intact are kept as `partial`.

    An empty output is a listing that says nothing (supported=None): nvidia-smi prints it on GPUs
    without NVLink (A10), and a capture that lost everything looks the same.
    """
    lines = text.splitlines()
    problems: list[str] = []
    # A last line without its newline is evidence when it is whole by the grammar (a listing kept in
    # a repository lost only its newline); a line cut inside ("26.5", "<inact") is never read.
    cut = bool(lines) and not text.endswith(("\n", "\r")) and not _complete(lines[-1])
    if cut:
        lines = lines[:-1]
    gpus: list[_Builder] = []
    saw_not_supported = False
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line:
            continue
        m = _GPU.match(line)
        if m:
            index = int(m.group(1))
            gpus.append(_Builder(index, m.group(2) or None, m.group(3) or None, lineno))
            gpus[-1].where.append(SourceLine(lineno, line))
            if len(gpus) > 1 and index <= gpus[-2].index:
                gpus[-1].damaged(f"line {lineno}: GPU {index} listed after GPU {gpus[-2].index}")
            if _GARBLED.search(line):
                gpus[-1].damaged(f"line {lineno} holds bytes nvidia-smi never prints")
            continue
        if _GARBLED.search(line):
            if not gpus:
                raise ParseError(f"line {lineno} holds bytes nvidia-smi never prints (NUL, not UTF-8)")
            gpus[-1].damaged(f"line {lineno} holds bytes nvidia-smi never prints (NUL, not UTF-8)")
            continue
        if _NOT_SUPPORTED.search(line):
            saw_not_supported = True
            if gpus:
                gpus[-1].no_nvlink = True
            continue
        current = gpus[-1] if gpus else None
        if current is None:
            raise ParseError(f"line {lineno}: {line[:60]!r} before any 'GPU n:' header")
        if _ALL_INACTIVE.search(line):
            current.all_inactive = True
            current.where.append(SourceLine(lineno, line))
            continue
        if _MIG.search(line):
            current.unavailable = "NVLink cannot be queried while the GPU is in MIG mode"
            continue
        lm = _LINK.match(line)
        if lm:
            number = int(lm.group(1))
            if number != len(current.links):
                current.damaged(f"line {lineno}: Link {number} where Link {len(current.links)} was due")
            try:
                current.links[number] = _speed(lm.group(2))
                if current.links[number] is None:
                    current.where.append(SourceLine(lineno, line))
            except ValueError:
                value = lm.group(2)[:30]
                current.damaged(f"line {lineno}: link value {value!r} is neither a speed nor <inactive>")
            continue
        current.damaged(f"line {lineno}: unexpected text {line[:60]!r}")

    if cut:
        if gpus:
            gpus[-1].damaged(f"cut short inside line {len(lines) + 1}")
        else:
            problems.append(f"cut short inside line {len(lines) + 1}")
    most = max((len(g.links) for g in gpus), default=0)
    for g in gpus:
        if g.links and len(g.links) < most:
            g.damaged(f"GPU {g.index} lists {len(g.links)} link(s), other GPUs {most} (line {g.line})")
    problems += [g.damage for g in gpus if g.damage is not None]

    if not gpus and not saw_not_supported:
        if text.strip():
            raise ParseError("no 'GPU n:' entry in nvlink output")
        return NvlinkReport(gpus=(), supported=None)
    intact = [g for g in gpus if g.damage is None]
    built = tuple(g.build() for g in intact)
    # "Not supported" on every GPU that printed nothing else: the node has no NVLink.
    no_info = [g for g in intact if not g.links and not g.all_inactive and g.unavailable is None]
    supported = not (saw_not_supported and len(no_info) == len(intact))
    report = NvlinkReport(gpus=built, supported=supported)
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        raise ParseError("; ".join(problems[:3]) + more, partial=report if built else None)
    return report
