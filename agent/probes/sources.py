"""Where NodeFacts come from: a live node or a recorded node snapshot directory.

Both sources hand the same parsers the same text, so a snapshot replays exactly what the live node
showed. Snapshot file names (all optional; a missing file means "not captured"):

  instance-type, boot_id, nvidia-smi-q.xml | nvidia-smi-q.txt, nvidia-smi-topo-m.txt,
  nvidia-smi-nvlink-s.txt, kmsg.log, sys/class/infiniband/..., sys/bus/pci/devices/...,
  node.json, dcgm-diag.json, errors.json ({file: {"kind": "timeout"|"tool-failed"|..., "message"}})
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

from agent.config import Config
from agent.core.contract import INSTANCE_TYPE_LABEL
from agent.core.dcgm_report import DiagReport
from agent.core.facts import NodeFacts
from agent.core.model import GpuInventory, KernelLog, NodeObject, NvlinkReport, RdmaSample, TopoMatrix
from agent.core.probed import NotCaptured, ParseError, Probed, ProbeError, ProbeErrorKind
from agent.probes.command import CommandOutput, run_command
from agent.probes.dcgm.diag_json import parse_dcgm_diag_json
from agent.probes.kernel_log import parse_kernel_log, read_kmsg_live
from agent.probes.node_object import parse_node_json
from agent.probes.nvlink import parse_nvlink
from agent.probes.nvsmi_errors import NvmlUnavailable, ProbeTimeout, ToolReportedFailure
from agent.probes.nvsmi_text import parse_nvsmi_text
from agent.probes.nvsmi_xml import parse_nvsmi_xml
from agent.probes.rdma import read_rdma
from agent.probes.topo import parse_topo

T = TypeVar("T")

XML, TEXT, TOPO, NVLINK = (
    "nvidia-smi-q.xml",
    "nvidia-smi-q.txt",
    "nvidia-smi-topo-m.txt",
    "nvidia-smi-nvlink-s.txt",
)
KMSG, NODE, BOOT_ID, ITYPE, ERRORS = "kmsg.log", "node.json", "boot_id", "instance-type", "errors.json"
DCGM_DIAG = "dcgm-diag.json"
COMMANDS: dict[str, list[str]] = {
    XML: ["nvidia-smi", "-q", "-x"],
    TOPO: ["nvidia-smi", "topo", "-m"],
    NVLINK: ["nvidia-smi", "nvlink", "-s"],
}
MAX_FILE_BYTES = 64 * 1024 * 1024


def parse_with(source: str, text: str | ProbeError | NotCaptured, parser: Callable[[str], T]) -> Probed[T]:
    """Run a parser, turning its typed failures into ProbeErrors (never an exception)."""
    if isinstance(text, (ProbeError, NotCaptured)):
        return text
    try:
        return parser(text)
    except ToolReportedFailure as exc:
        return ProbeError(source, ProbeErrorKind.TOOL_FAILED, str(exc))
    except ParseError as exc:
        return ProbeError(source, ProbeErrorKind.UNREADABLE, str(exc) or "malformed output")


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


class Source(Protocol):
    def gpus(self) -> Probed[GpuInventory]: ...
    def topo(self) -> Probed[TopoMatrix]: ...
    def nvlink(self) -> Probed[NvlinkReport]: ...
    def kernel(self) -> Probed[KernelLog]: ...
    def rdma(self) -> Probed[RdmaSample]: ...
    def node(self) -> Probed[NodeObject]: ...
    def dcgm_diag(self) -> Probed[DiagReport]: ...
    def boot_id(self) -> str | None: ...
    def instance_type(self) -> str | None: ...


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
            return ProbeError(_source_name(name), kind, str(recorded.get("message", "")))
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
        """The XML view, with GPUs that the text view reports lost (only it prints them) merged in."""
        xml = self.text(XML)
        text = self.text(TEXT)
        if isinstance(xml, NotCaptured):
            return self.memo.parse(TEXT, text, parse_nvsmi_text)
        inv = self.memo.parse(XML, xml, parse_nvsmi_xml)
        if not isinstance(inv, GpuInventory) or not isinstance(text, str):
            return inv
        other = self.memo.parse(TEXT, text, parse_nvsmi_text)
        if not isinstance(other, GpuInventory):
            return inv
        known = {g.pci_bus_id for g in inv.gpus} | {lost.pci_bus_id for lost in inv.lost}
        extra = tuple(lost for lost in other.lost if lost.pci_bus_id not in known)
        return replace(inv, lost=(*inv.lost, *extra)) if extra else inv

    def topo(self) -> Probed[TopoMatrix]:
        return self.memo.parse(TOPO, self.text(TOPO), parse_topo)

    def nvlink(self) -> Probed[NvlinkReport]:
        return self.memo.parse(NVLINK, self.text(NVLINK), parse_nvlink)

    def kernel(self) -> Probed[KernelLog]:
        return self.memo.parse(KMSG, self.text(KMSG), parse_kernel_log)

    def rdma(self) -> Probed[RdmaSample]:
        class_dir = self.root / "sys" / "class" / "infiniband"
        if not class_dir.is_dir():
            return NotCaptured("sys/class/infiniband")
        return _read_rdma(class_dir, self.root / "sys" / "bus" / "pci" / "devices")

    def node(self) -> Probed[NodeObject]:
        return self.memo.parse(NODE, self.text(NODE), parse_node_json)

    def dcgm_diag(self) -> Probed[DiagReport]:
        return self.memo.parse(DCGM_DIAG, self.text(DCGM_DIAG), parse_dcgm_diag_json)

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


def _read_rdma(class_dir: Path, pci_dir: Path) -> Probed[RdmaSample]:
    try:
        return read_rdma(class_dir, pci_dir if pci_dir.is_dir() else None)
    except FileNotFoundError:
        return NotCaptured(str(class_dir))
    except OSError as exc:
        return ProbeError(str(class_dir), ProbeErrorKind.UNREADABLE, exc.strerror or str(exc))


def _source_name(name: str) -> str:
    return " ".join(COMMANDS[name]) if name in COMMANDS else name


class LiveSource:
    """Reads the live node: NVML first, nvidia-smi as the fallback, /dev/kmsg, /sys."""

    def __init__(
        self,
        timeout_s: float = 30.0,
        sys_root: Path = Path("/sys"),
        kmsg_path: str = "/dev/kmsg",
        use_nvml: bool = True,
        node_loader: Callable[[], Probed[NodeObject]] | None = None,
        instance_type: str | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.sys_root = sys_root
        self.kmsg_path = kmsg_path
        self.use_nvml = use_nvml
        self.node_loader = node_loader
        self._instance_type = instance_type
        self.memo = ParseMemo()

    def run(self, name: str) -> CommandOutput | ProbeError:
        return run_command(COMMANDS[name], self.timeout_s)

    def text(self, name: str) -> str | ProbeError:
        out = self.run(name)
        if isinstance(out, ProbeError):
            return out
        if out.returncode != 0 and not out.stdout.strip():
            msg = (out.stderr.strip() or f"exit code {out.returncode}").splitlines()[0]
            return ProbeError(_source_name(name), ProbeErrorKind.TOOL_FAILED, msg)
        return out.stdout

    def gpus(self) -> Probed[GpuInventory]:
        if self.use_nvml:
            nvml = _read_nvml(self.timeout_s)
            if not (isinstance(nvml, ProbeError) and nvml.kind is ProbeErrorKind.UNAVAILABLE):
                return nvml
        return self.memo.parse(_source_name(XML), self.text(XML), parse_nvsmi_xml)

    def topo(self) -> Probed[TopoMatrix]:
        return self.memo.parse(_source_name(TOPO), self.text(TOPO), parse_topo)

    def nvlink(self) -> Probed[NvlinkReport]:
        return self.memo.parse(_source_name(NVLINK), self.text(NVLINK), parse_nvlink)

    def kernel(self) -> Probed[KernelLog]:
        try:
            return read_kmsg_live(self.kmsg_path, timeout_s=min(self.timeout_s, 5.0))
        except FileNotFoundError:
            return ProbeError(self.kmsg_path, ProbeErrorKind.UNAVAILABLE, "not present (mount /dev/kmsg)")
        except PermissionError:
            return ProbeError(
                self.kmsg_path, ProbeErrorKind.UNAVAILABLE, "permission denied (needs CAP_SYSLOG)"
            )
        except OSError as exc:
            return ProbeError(self.kmsg_path, ProbeErrorKind.UNREADABLE, exc.strerror or str(exc))

    def rdma(self) -> Probed[RdmaSample]:
        class_dir = self.sys_root / "class" / "infiniband"
        if not class_dir.is_dir():
            # No RDMA devices at all on this node: an empty sample, so the EFA count rule can judge it.
            return RdmaSample(devices=(), taken_at=time.monotonic())
        return _read_rdma(class_dir, self.sys_root / "bus" / "pci" / "devices")

    def node(self) -> Probed[NodeObject]:
        if self.node_loader is None:
            return NotCaptured("Node object (no API access)")
        return self.node_loader()

    def dcgm_diag(self) -> Probed[DiagReport]:
        return NotCaptured("dcgm diag (runs in the agent's dcgm-diag tier)")

    def boot_id(self) -> str | None:
        try:
            return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
        except OSError:
            return None

    def instance_type(self) -> str | None:
        return self._instance_type or os.environ.get("GPU_HEALTHCHECK_INSTANCE_TYPE") or None


def _read_nvml(timeout_s: float) -> Probed[GpuInventory]:
    """NVML through nvidia-ml-py; UNAVAILABLE when the library cannot be loaded (fall back to nvidia-smi)."""
    from agent.probes.nvml import read_nvml

    try:
        return read_nvml(timeout_s)
    except NvmlUnavailable as exc:
        return ProbeError("nvml", ProbeErrorKind.UNAVAILABLE, str(exc))
    except ProbeTimeout as exc:
        return ProbeError("nvml", ProbeErrorKind.TIMEOUT, str(exc) or f"no answer after {timeout_s:g} s")
    except ToolReportedFailure as exc:
        return ProbeError("nvml", ProbeErrorKind.TOOL_FAILED, str(exc))


def resolve_instance_type(
    source: Source, cfg: Config, node: Probed[NodeObject], override: str | None
) -> tuple[str | None, str]:
    """--instance-type, then the config override, then the Node label, then the snapshot's file."""
    if override:
        return override, "--instance-type"
    configured = str(cfg.get("instanceType") or "")
    if configured:
        return configured, "config"
    if isinstance(node, NodeObject) and node.labels.get(INSTANCE_TYPE_LABEL):
        return node.labels[INSTANCE_TYPE_LABEL], "node label"
    recorded = source.instance_type()
    if recorded:
        return recorded, "instance-type file"
    return None, ""


def gather_facts(
    source: Source,
    cfg: Config,
    *,
    instance_type: str | None = None,
    rdma_previous: RdmaSample | None = None,
    only: Callable[[str], bool] = lambda _: True,
) -> NodeFacts:
    """Read every input the enabled checks need. `only(input)` lets callers skip unneeded probes."""
    node = source.node() if only("node") else NotCaptured("node.json")
    itype, itype_source = resolve_instance_type(source, cfg, node, instance_type)
    return NodeFacts(
        instance_type=itype,
        instance_type_source=itype_source,
        profile=cfg.profiles.get(itype) if itype else None,
        boot_id=source.boot_id() or (node.boot_id if isinstance(node, NodeObject) else None),
        gpus=source.gpus() if only("gpus") else NotCaptured("nvidia-smi"),
        topo=source.topo() if only("topo") else NotCaptured("nvidia-smi topo -m"),
        nvlink=source.nvlink() if only("nvlink") else NotCaptured("nvidia-smi nvlink -s"),
        kernel=source.kernel() if only("kernel") else NotCaptured("kernel log"),
        rdma=source.rdma() if only("rdma") else NotCaptured("sysfs infiniband"),
        rdma_previous=rdma_previous,
        node=node,
        dcgm_diag=source.dcgm_diag() if only("dcgm_diag") else NotCaptured("dcgm-diag.json"),
    )
