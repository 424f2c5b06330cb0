"""Where NodeFacts come from: the Source protocol both sources implement (a live node in
agent.probes.live, a recorded node snapshot in agent.probes.snapshot), the parse helpers they share,
and the one place that turns inputs into NodeFacts (assemble_facts, for gather_facts and the engine).

Both sources hand the same parsers the same text, so a snapshot replays exactly what the live node
showed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

from agent.config import Config
from agent.core import trend_history
from agent.core.contract import INSTANCE_TYPE_LABEL, Keys, decode_results
from agent.core.dcgm_report import DiagReport
from agent.core.facts import Input, NodeFacts
from agent.core.model import (
    GpuInventory,
    HostInfo,
    KernelXids,
    NodeObject,
    NvlinkErrorSample,
    NvlinkReport,
    PciSample,
    RdmaSample,
    TopoMatrix,
)
from agent.core.probed import NotCaptured, ParseError, Probed, ProbeError, ProbeErrorKind
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


class Source(Protocol):
    kernel_tail: KernelTail  # the kernel log's incremental reader, shared with the follower thread

    def gpus(self) -> Probed[GpuInventory]: ...
    def topo(self) -> Probed[TopoMatrix]: ...
    def nvlink(self) -> Probed[NvlinkReport]: ...
    def kernel(self) -> Probed[KernelXids]: ...
    def rdma(self) -> Probed[RdmaSample]: ...
    def node(self) -> Probed[NodeObject]: ...
    def dcgm_diag(self) -> Probed[DiagReport]: ...
    def pci(self) -> Probed[PciSample]: ...
    def host(self) -> Probed[HostInfo]: ...
    def nvlink_errors(self) -> Probed[NvlinkErrorSample]: ...
    def boot_id(self) -> str | None: ...
    def instance_type(self) -> str | None: ...


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


def resolve_instance_type(
    source: Source, cfg: Config, node: Probed[NodeObject], override: str | None
) -> tuple[str | None, str]:
    """--instance-type, then the config override, then the Node label, then the snapshot's file."""
    if override:
        return override, "--instance-type"
    configured = cfg.instance_type
    if configured:
        return configured, "config"
    if isinstance(node, NodeObject) and node.labels.get(INSTANCE_TYPE_LABEL):
        return node.labels[INSTANCE_TYPE_LABEL], "node label"
    recorded = source.instance_type()
    if recorded:
        return recorded, "instance-type file"
    return None, ""


def source_readers(source: Source) -> dict[Input, Callable[[], Any]]:
    """How a source reads each input (dcgm_health has no file or tool of its own: the live agent
    polls the DCGM host engine)."""
    return {
        Input.NODE: source.node,
        Input.GPUS: source.gpus,
        Input.TOPO: source.topo,
        Input.NVLINK: source.nvlink,
        Input.KERNEL: source.kernel,
        Input.RDMA: source.rdma,
        Input.DCGM_DIAG: source.dcgm_diag,
        Input.PCI: source.pci,
        Input.HOST: source.host,
        Input.NVLINK_ERRORS: source.nvlink_errors,
    }


def assemble_facts(
    source: Source,
    cfg: Config,
    inputs: Mapping[Input, Any],
    *,
    boot_id: str | None,
    instance_type: str | None = None,
    rdma_previous: RdmaSample | None = None,
    pci_previous: PciSample | None = None,
    nvlink_errors_previous: NvlinkErrorSample | None = None,
) -> NodeFacts:
    """NodeFacts from the inputs read (one not read stays NotCaptured), with the instance type
    resolved (resolve_instance_type) and its profile."""
    read = {name.value: value for name, value in inputs.items()}
    facts = replace(
        NodeFacts(rdma_previous=rdma_previous, **read),
        pci_previous=pci_previous,
        nvlink_errors_previous=nvlink_errors_previous,
    )
    itype, itype_source = resolve_instance_type(source, cfg, facts.node, instance_type)
    return replace(
        facts,
        instance_type=itype,
        instance_type_source=itype_source,
        profile=cfg.profiles.get(itype) if itype else None,
        boot_id=boot_id,
    )


def kept_trends(node: Probed[NodeObject], prefix: str) -> trend_history.TrendHistory:
    """The trend reads the agent kept in the Node's results annotation (none: an empty history)."""
    if not isinstance(node, NodeObject):
        return trend_history.TrendHistory()
    doc = decode_results(node.annotations.get(Keys(prefix).results))
    return trend_history.parse(doc.get(trend_history.TRENDS_FIELD)) if doc else trend_history.TrendHistory()


def gather_facts(
    source: Source,
    cfg: Config,
    *,
    instance_type: str | None = None,
    rdma_previous: RdmaSample | None = None,
    only: Callable[[Input], bool] = lambda _: True,
    now: float | None = None,
) -> NodeFacts:
    """Read every input the enabled checks need. `only(input)` lets callers skip unneeded probes.
    The trend checks judge this read with the reads the agent kept on the Node (node.json of a
    snapshot, the Node live), this one added when due (`now`: epoch seconds, default the clock)."""
    inputs = {name: read() for name, read in source_readers(source).items() if only(name)}
    node = inputs.get(Input.NODE)
    facts = assemble_facts(
        source,
        cfg,
        inputs,
        boot_id=source.boot_id() or (node.boot_id if isinstance(node, NodeObject) else None),
        instance_type=instance_type,
        rdma_previous=rdma_previous,
    )
    t = cfg.trends
    kept = kept_trends(facts.node, cfg.prefix)
    stamp = time.time() if now is None else now
    return with_read(facts, kept, stamp, t.read_spacing_s, t.keep_reads, t.clock_busy_percent)


def with_read(
    facts: NodeFacts,
    history: trend_history.TrendHistory,
    now: float,
    spacing_s: float,
    keep: int,
    busy_percent: float,
) -> NodeFacts:
    """NodeFacts carrying the history with this cycle's read in it (when due)."""
    read = trend_history.take_read(
        facts.gpus, facts.nvlink_errors, facts.pci, facts.boot_id, now, busy_percent
    )
    return replace(facts, trends=trend_history.advance(history, read, spacing_s, keep))
