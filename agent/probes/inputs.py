"""One definition per input of the checks (InputSpec): its name and type, the tool output it is
parsed from (probes/tool_outputs.py: the command, the snapshot file, the parser), the readers of
their own a source has for it where it is not read that way, the tier that refreshes it and whether
the agent keeps its previous read. The sources (probes/source.py), the scheduler
(engine/scheduler.py) and the engine read this table and name no input themselves; NodeFacts
(core/facts.py, which may not import probes) holds one field per spec, and tests/test_inputs.py
holds the two to each other.

A new input from a tool's output is its row in probes/tool_outputs.py (command, file, parser: the
live source runs it, capture writes it, the snapshot source parses the file), one spec here, its
type and NodeFacts field in core/, its parser and its check; live.py, snapshot.py and capture.py
are not edited. An input read another way (NVML, sysfs, the API) adds its reader to the source."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.core.dcgm_report import DiagReport, HealthReport
from agent.core.dra import DraSlices
from agent.core.facts import Input, NodeFacts
from agent.core.gpu import GpuInventory
from agent.core.host import HostInfo
from agent.core.kernel import KernelXids
from agent.core.metric_labels import GpuSource
from agent.core.node import NodeObject
from agent.core.nvlink import NvlinkErrorSample, NvlinkReport
from agent.core.pci import PciSample
from agent.core.probed import NotCaptured, Probed
from agent.core.rdma import RdmaSample
from agent.core.sdc_report import SdcReport
from agent.core.telemetry import Telemetry
from agent.core.topo import TopoMatrix
from agent.probes.live import LiveSource
from agent.probes.snapshot import SnapshotSource
from agent.probes.tool_outputs import DCGM_DIAG, NODE, NVLINK, NVLINK_ERRORS, SDC, TOPO, ToolOutput


@dataclass(frozen=True)
class InputSpec:
    input: Input  # its name: the NodeFacts field that holds it
    type: type[Any]  # what a read that worked gives (the field is Probed[type])
    live: Callable[[LiveSource], Probed[Any]] | None  # a reader of its own; None: `output`'s command
    snapshot: Callable[[SnapshotSource], Probed[Any]] | None  # a reader of its own; None: `output`'s file
    tier: str | None  # the tier that refreshes it; None: read as it is now, at every evaluation
    keep_previous: bool = False  # the agent keeps its previous read (NodeFacts.<name>_previous): rates
    unread: str = ""  # what an engine run says for it when no source reads it and no reader was given
    on_read: Callable[[Telemetry, Any], None] | None = None  # what a read that worked tells the metrics
    output: ToolOutput[Any] | None = None  # the tool output it is parsed from (probes/tool_outputs.py)

    @property
    def previous_field(self) -> str:
        return f"{self.input.value}_previous"

    def live_reader(self, source: LiveSource) -> Callable[[], Probed[Any]] | None:
        """Its reader of its own, else its output's command; None: the live source does not read it."""
        if self.live is not None:
            return functools.partial(self.live, source)
        if self.output is not None and self.output.argv:
            return functools.partial(source.read, self.output)
        return None

    def snapshot_reader(self, source: SnapshotSource) -> Callable[[], Probed[Any]] | None:
        """Its reader of its own, else its output's file; None: a snapshot does not hold it."""
        if self.snapshot is not None:
            return functools.partial(self.snapshot, source)
        if self.output is not None:
            return functools.partial(source.read, self.output)
        return None


def _kernel_metrics(metrics: Telemetry, kernel: KernelXids) -> None:
    metrics.record_kernel_log(kernel.records, kernel.lost, kernel.untallied)


def _driver_taint_metrics(metrics: Telemetry, dra: DraSlices) -> None:
    metrics.record_driver_taints(dra.taint_series())  # the DRA driver's own (checks/dra_taints.py)


# The GPUs each source counts (gpu_healthcheck_gpus_seen), set as it is read; gpu.allocatable and
# dcgm-health compare them.
def _gpus_seen(metrics: Telemetry, inv: GpuInventory) -> None:
    metrics.record_gpus_seen(GpuSource.NVML if inv.source == "nvml" else GpuSource.NVIDIA_SMI, inv.visible)


def _dra_seen(metrics: Telemetry, dra: DraSlices) -> None:
    published = None if dra.incomplete else len([p for p in dra.gpus() if not p.passthrough_only])
    metrics.record_gpus_seen(GpuSource.DRA, published)


def _dcgm_seen(metrics: Telemetry, report: HealthReport) -> None:
    watched = report.gpus_watched
    metrics.record_gpus_seen(GpuSource.DCGM, None if watched is None else len(watched))


def _allocatable_seen(metrics: Telemetry, node: NodeObject) -> None:
    metrics.record_gpus_seen(GpuSource.ALLOCATABLE, node.allocatable_gpus)  # None: no device plugin


def _dra_read(metrics: Telemetry, dra: DraSlices) -> None:
    _driver_taint_metrics(metrics, dra)
    _dra_seen(metrics, dra)


# In the order a whole read runs (gather_facts) and each tier reads its inputs.
SPECS: tuple[InputSpec, ...] = (
    # The writer's copy live; its allocatable GPUs are counted with each read of the GPUs (record_reads).
    InputSpec(Input.NODE, NodeObject, LiveSource.node, None, None, on_read=_allocatable_seen, output=NODE),
    # The previous inventory: a GPU's correctable-ECC rate when the DCGM engine stops answering.
    InputSpec(
        Input.GPUS,
        GpuInventory,
        LiveSource.gpus,
        SnapshotSource.gpus,
        "gpu",
        keep_previous=True,
        on_read=_gpus_seen,
    ),
    # The agent reads it from its ResourceSlice watch (an extra input, cli/agent.py), as of each gpu cycle.
    InputSpec(Input.DRA, DraSlices, LiveSource.dra, SnapshotSource.dra, "gpu", on_read=_dra_read),
    # NVML where it answers; the output's command where it cannot (probes/nvml_topo, nvml_links).
    InputSpec(Input.TOPO, TopoMatrix, LiveSource.topo, None, "topology", output=TOPO),
    InputSpec(Input.NVLINK, NvlinkReport, LiveSource.nvlink, None, "topology", output=NVLINK),
    InputSpec(
        Input.KERNEL, KernelXids, LiveSource.kernel, SnapshotSource.kernel, "xid", on_read=_kernel_metrics
    ),
    InputSpec(Input.RDMA, RdmaSample, LiveSource.rdma, SnapshotSource.rdma, "efa", keep_previous=True),
    InputSpec(Input.DCGM_DIAG, DiagReport, LiveSource.dcgm_diag, None, "dcgm-diag", output=DCGM_DIAG),
    # No file or tool of its own: the live agent polls the DCGM host engine (an extra input).
    InputSpec(
        Input.DCGM_HEALTH,
        HealthReport,
        None,
        None,
        "dcgm-health",
        unread="dcgm health (no host engine configured)",
        on_read=_dcgm_seen,
    ),
    # The live agent asks the node's SDC probe server in the active-check window (an extra input).
    InputSpec(
        Input.SDC, SdcReport, None, None, "sdc-probe", unread="sdc probe (sdc.address not set)", output=SDC
    ),
    InputSpec(Input.PCI, PciSample, LiveSource.pci, SnapshotSource.pci, "topology", keep_previous=True),
    InputSpec(Input.HOST, HostInfo, LiveSource.host, SnapshotSource.host, "topology"),
    InputSpec(
        Input.NVLINK_ERRORS,
        NvlinkErrorSample,
        LiveSource.nvlink_errors,  # NVML; a snapshot keeps its read as our JSON (capture)
        None,
        "topology",
        keep_previous=True,
        output=NVLINK_ERRORS,
    ),
)
SPEC: dict[Input, InputSpec] = {s.input: s for s in SPECS}


def source_readers(source: LiveSource | SnapshotSource) -> dict[Input, Callable[[], Probed[Any]]]:
    """How this source reads each input it reads (an input no source reads is left out)."""
    readers = {
        s.input: s.live_reader(source) if isinstance(source, LiveSource) else s.snapshot_reader(source)
        for s in SPECS
    }
    return {name: read for name, read in readers.items() if read is not None}


def unread_readers() -> dict[Input, Callable[[], Probed[Any]]]:
    """For each input no source reads, a reader saying so (the agent gives its own: extra inputs)."""
    return {s.input: functools.partial(NotCaptured, s.unread) for s in SPECS if s.unread}


def keep_previous_reads(
    previous: dict[Input, Any], inputs: dict[Input, Any], names: tuple[Input, ...]
) -> None:
    """Before `names` are read again: keep each one's last read that worked, where its spec asks."""
    for name in names:
        spec, last = SPEC[name], inputs.get(name)
        if spec.keep_previous and isinstance(last, spec.type):
            previous[name] = last


def record_reads(metrics: Telemetry, facts: NodeFacts, names: tuple[Input, ...]) -> None:
    """After `names` were read: what each read that worked tells the metrics, where its spec says;
    with the GPUs, the Node as they were judged against it."""
    for name in (*names, Input.NODE) if Input.GPUS in names else names:
        spec, value = SPEC[name], getattr(facts, name.value)
        if spec.on_read is not None and isinstance(value, spec.type):
            spec.on_read(metrics, value)
