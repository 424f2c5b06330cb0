"""A recorded node snapshot directory as a Source (`check --from-snapshot DIR`, tests, the demo).

kmsg.log may grow while the agent runs (tests and the benchmark append to it): it is read
incrementally, like /dev/kmsg on a live node (agent.probes.kernel_tail). A kmsg.log that is a FIFO
or a character device (a stand-in for /dev/kmsg: bench/fault_to_taint --kmsg fifo) is read as the
device is, one record at a time as it is written.

Snapshot file names (all optional; a missing file means "not captured"):

  instance-type, boot_id, nvidia-smi-q.xml | nvidia-smi-q.txt, nvidia-smi-topo-m.txt,
  nvidia-smi-nvlink-s.txt, kmsg.log, sys/class/infiniband/..., sys/bus/pci/devices/...,
  sys/devices/pci*/... (the whole PCI bus, its hierarchy kept; without it the bus is not captured:
  older snapshots hold only the RDMA NICs' functions under sys/bus/pci/devices),
  sys/devices/system/{cpu,node}/... (CPU and NUMA lists),
  nvlink-errors.json (NVML's NVLink error counters, our JSON),
  node.json, resourceslices.json (this node's gpu.nvidia.com ResourceSlices, kubectl -o json),
  dcgm-diag.json, errors.json ({file: {"kind": "timeout"|"tool-failed"|..., "message"}})
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

from agent.core.dcgm_report import DiagReport
from agent.core.dra import DraSlices
from agent.core.gpu import GpuInventory
from agent.core.host import HostInfo
from agent.core.kernel import KernelXids
from agent.core.node import NodeObject
from agent.core.nvlink import NvlinkErrorSample, NvlinkReport
from agent.core.pci import PciSample
from agent.core.probed import NotCaptured, Probed, ProbeError, ProbeErrorKind
from agent.core.rdma import RdmaSample
from agent.core.sdc_report import SdcReport, parse_sdc_report
from agent.core.topo import TopoMatrix
from agent.probes.dcgm.diag_json import parse_dcgm_diag_json
from agent.probes.dra_slices import parse_slices_json
from agent.probes.kernel_tail import KernelTail
from agent.probes.node_object import parse_node_json
from agent.probes.nvlink import parse_nvlink
from agent.probes.nvlink_errors import parse_nvlink_errors_json
from agent.probes.nvsmi_errors import with_lost_lines
from agent.probes.nvsmi_text import parse_nvsmi_text
from agent.probes.nvsmi_xml import parse_nvsmi_xml
from agent.probes.reading import (
    ParseMemo,
    parse_with,
    read_host_tree,
    read_kernel_tail,
    read_pci_tree,
    read_rdma_tree,
)
from agent.probes.topo import parse_topo

XML, TEXT, TOPO, NVLINK = (
    "nvidia-smi-q.xml",
    "nvidia-smi-q.txt",
    "nvidia-smi-topo-m.txt",
    "nvidia-smi-nvlink-s.txt",
)
KMSG, NODE, BOOT_ID, ITYPE, ERRORS = "kmsg.log", "node.json", "boot_id", "instance-type", "errors.json"
DCGM_DIAG = "dcgm-diag.json"
SDC = "sdc-probe.json"  # the SDC probe's report (sdcprobe/), as its server returns it
NVLINK_ERRORS = "nvlink-errors.json"  # our own format: NVML's NVLink error counters
SLICES = "resourceslices.json"  # kubectl get resourceslices -o json: NVIDIA's DRA driver's devices
PCI_HIERARCHY = "sys/devices"  # its pci* folders: written only by a capture of the whole bus
HOST_DIR = "sys/devices/system"
COMMANDS: dict[str, list[str]] = {
    XML: ["nvidia-smi", "-q", "-x"],
    TOPO: ["nvidia-smi", "topo", "-m"],
    NVLINK: ["nvidia-smi", "nvlink", "-s"],
}
# The snapshot file that holds each tool's output, by the name the parsed data carries as `source`.
SNAPSHOT_FILES = {"nvidia-smi -q": TEXT, **{" ".join(argv): name for name, argv in COMMANDS.items()}}
MAX_FILE_BYTES = 64 * 1024 * 1024


def source_name(name: str) -> str:
    """How a probe error names where a file came from: the command that prints it, or the file."""
    return " ".join(COMMANDS[name]) if name in COMMANDS else name


def _is_stream(path: Path) -> bool:
    """A FIFO or a character device: read as /dev/kmsg is, not as a file that grows."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)


class SnapshotError(Exception):
    """The snapshot directory itself is unusable (missing, not a directory)."""


class SnapshotSource:
    """Reads a node snapshot directory. Re-reads files on every call (tests edit them while we run)."""

    def __init__(self, root: Path) -> None:
        if not root.exists():
            raise SnapshotError(f"snapshot directory {root} does not exist")
        if not root.is_dir():
            raise SnapshotError(f"{root} is not a directory")
        self.root = root
        self.memo = ParseMemo()
        self.kernel_tail = KernelTail(str(root / KMSG), device=_is_stream(root / KMSG))

    def _errors(self) -> dict[str, Any]:
        path = self.root / ERRORS
        if not path.is_file():
            return {}
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return doc if isinstance(doc, dict) else {}

    def text(self, name: str) -> str | ProbeError | NotCaptured:
        recorded = self._errors().get(name)
        if isinstance(recorded, dict):
            try:
                kind = ProbeErrorKind(str(recorded.get("kind")))
            except ValueError:
                kind = ProbeErrorKind.TOOL_FAILED
            return ProbeError(source_name(name), kind, str(recorded.get("message", "")))
        path = self.root / name
        if not path.exists():
            return NotCaptured(name)
        try:
            with path.open("rb") as fh:
                data = fh.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            return ProbeError(name, ProbeErrorKind.UNREADABLE, f"cannot read: {exc.strerror or exc}")
        if len(data) > MAX_FILE_BYTES:
            return ProbeError(name, ProbeErrorKind.UNREADABLE, f"larger than {MAX_FILE_BYTES} bytes")
        return data.decode("utf-8", errors="replace")

    def gpus(self) -> Probed[GpuInventory]:
        """The XML view. nvidia-smi -q -x prints a lost GPU's error on stderr, which the snapshot
        does not keep with the XML; the text view prints it: those lines are added to the XML text,
        as nvidia-smi would have printed them beside it."""
        xml = self.text(XML)
        text = self.text(TEXT)
        if isinstance(xml, NotCaptured):
            return self.memo.parse(TEXT, text, parse_nvsmi_text)
        if isinstance(xml, str) and isinstance(text, str):
            xml = with_lost_lines(xml, text)
        return self.memo.parse(XML, xml, parse_nvsmi_xml)

    def topo(self) -> Probed[TopoMatrix]:
        return self.memo.parse(TOPO, self.text(TOPO), parse_topo)

    def nvlink(self) -> Probed[NvlinkReport]:
        return self.memo.parse(NVLINK, self.text(NVLINK), parse_nvlink)

    def kernel(self) -> Probed[KernelXids]:
        """kmsg.log read incrementally: only what was appended since the last read is parsed."""
        recorded = self._errors().get(KMSG)
        if isinstance(recorded, dict):
            self.kernel_tail.forget()
            text = self.text(KMSG)
            assert isinstance(text, ProbeError)
            return text
        return read_kernel_tail(self.kernel_tail, KMSG)

    def rdma(self) -> Probed[RdmaSample]:
        class_dir = self.root / "sys" / "class" / "infiniband"
        if not class_dir.is_dir():
            return NotCaptured("sys/class/infiniband")
        return read_rdma_tree(class_dir, self.root / "sys" / "bus" / "pci" / "devices")

    def pci(self) -> Probed[PciSample]:
        tops = self.root / PCI_HIERARCHY
        if not (tops.is_dir() and any(p.name.startswith("pci") for p in tops.iterdir())):
            return NotCaptured(PCI_HIERARCHY)
        return read_pci_tree(self.root / "sys" / "bus" / "pci" / "devices")

    def nvlink_errors(self) -> Probed[NvlinkErrorSample]:
        return self.memo.parse(NVLINK_ERRORS, self.text(NVLINK_ERRORS), parse_nvlink_errors_json)

    def host(self) -> Probed[HostInfo]:
        system = self.root / HOST_DIR
        if not system.is_dir():
            return NotCaptured(HOST_DIR)
        return read_host_tree(system)

    def node(self) -> Probed[NodeObject]:
        return self.memo.parse(NODE, self.text(NODE), parse_node_json)

    def dcgm_diag(self) -> Probed[DiagReport]:
        return self.memo.parse(DCGM_DIAG, self.text(DCGM_DIAG), parse_dcgm_diag_json)

    def sdc(self) -> Probed[SdcReport]:
        return self.memo.parse(SDC, self.text(SDC), parse_sdc_report)

    def dra(self) -> Probed[DraSlices]:
        """This node's slices (node.json names it; without one, the file must hold one node's)."""
        node = self.node()
        name = node.name if isinstance(node, NodeObject) else None
        return parse_with(SLICES, self.text(SLICES), lambda t: parse_slices_json(t, name))

    def _line(self, name: str) -> str | None:
        text = self.text(name)
        if isinstance(text, str):
            value = text.strip().splitlines()[0].strip() if text.strip() else ""
            return value or None
        return None

    def boot_id(self) -> str | None:
        return self._line(BOOT_ID)

    def instance_type(self) -> str | None:
        return self._line(ITYPE)
