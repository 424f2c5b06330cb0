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

from agent.core.model import NvlinkGpu, NvlinkReport
from agent.core.probed import ParseError

_GPU = re.compile(r"^GPU\s+(\d+)\s*:\s*(.*?)\s*(?:\(UUID:\s*([^)]*?)\s*\))?\s*$")
_LINK = re.compile(r"^Link\s+(\d+)\s*:\s*(.*?)\s*$")
_SPEED = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*GB/s$", re.IGNORECASE)
_ALL_INACTIVE = re.compile(r"all links are inactive", re.IGNORECASE)
_NOT_SUPPORTED = re.compile(r"does not have or support nvlink|nvlink is not supported", re.IGNORECASE)
_MIG = re.compile(r"not supported for devices in MIG mode", re.IGNORECASE)


class _Builder:
    def __init__(self, index: int, name: str | None, uuid: str | None) -> None:
        self.index = index
        self.name = name
        self.uuid = uuid
        self.links: dict[int, float | None] = {}
        self.all_inactive = False
        self.no_nvlink = False
        self.unavailable: str | None = None

    def build(self) -> NvlinkGpu:
        return NvlinkGpu(
            index=self.index,
            name=self.name,
            uuid=self.uuid,
            links=dict(self.links),
            all_inactive=self.all_inactive,
            unavailable=self.unavailable,
        )


def _speed(text: str) -> float | None:
    """ "26.562 GB/s" → 26.562; "<inactive>" or anything else → None (the link carries no traffic)."""
    m = _SPEED.match(text)
    return float(m.group(1)) if m else None


def parse_nvlink(text: str) -> NvlinkReport:
    """Parse the status listing; ParseError when the text is neither a listing nor a known message."""
    gpus: list[_Builder] = []
    saw_not_supported = False
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        m = _GPU.match(line)
        if m:
            try:
                index = int(m.group(1))
            except ValueError:
                raise ParseError(f"line {lineno}: bad GPU index") from None
            gpus.append(_Builder(index, m.group(2) or None, m.group(3) or None))
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
            continue
        if _MIG.search(line):
            current.unavailable = "NVLink cannot be queried while the GPU is in MIG mode"
            continue
        lm = _LINK.match(line)
        if lm:
            try:
                number = int(lm.group(1))
            except ValueError:
                raise ParseError(f"line {lineno}: bad link number") from None
            current.links[number] = _speed(lm.group(2))
            continue
        raise ParseError(f"line {lineno}: unexpected text {line[:60]!r}")

    if not gpus and not saw_not_supported:
        if text.strip():
            raise ParseError("no 'GPU n:' entry in nvlink output")
        return NvlinkReport(gpus=(), supported=False)
    built = tuple(g.build() for g in gpus)
    # "Not supported" on every GPU that printed nothing else: the node has no NVLink.
    no_info = [g for g in gpus if not g.links and not g.all_inactive and g.unavailable is None]
    if saw_not_supported and len(no_info) == len(gpus):
        return NvlinkReport(gpus=built, supported=False)
    return NvlinkReport(gpus=built, supported=True)
