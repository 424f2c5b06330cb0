"""The live node as a Source: NVML first, nvidia-smi as the fallback, /dev/kmsg, /sys.

One slow read is not a broken GPU: a GPU inventory read that timed out gets one second try in the
same cycle, from nvidia-smi (a hung NVML call cannot be retried while its thread is stuck in the
driver; nvidia-smi is a separate process that can be killed), within what is left of
`timeouts.check`, so the whole read never takes longer than before. Each GPU inventory read is
timed (Telemetry.record_tool_read), so a read that slows down shows before it times out; the other
tools' timeouts only make their checks unknown (counted in probe errors) and are not timed, to keep
an agent's series few (bench/metrics_size.py)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from agent.core.dcgm_report import DiagReport
from agent.core.dra import DraSlices
from agent.core.gpu import GpuInventory
from agent.core.host import HostInfo
from agent.core.kernel import KernelXids
from agent.core.metric_labels import ToolOutcome
from agent.core.node import NodeObject
from agent.core.nvlink import NvlinkErrorSample, NvlinkReport
from agent.core.pci import PciSample
from agent.core.probed import NotCaptured, Probed, ProbeError, ProbeErrorKind
from agent.core.rdma import RdmaSample
from agent.core.telemetry import NoTelemetry, Telemetry
from agent.core.topo import TopoMatrix
from agent.probes.command import CommandOutput, run_command
from agent.probes.kernel_tail import KernelTail
from agent.probes.nvsmi_errors import NvmlUnavailable, ProbeTimeout, ToolReportedFailure, with_lost_lines
from agent.probes.reading import ParseMemo, read_host_tree, read_kernel_tail, read_pci_tree, read_rdma_tree
from agent.probes.tool_outputs import GPU_XML, NVLINK, TOPO, ToolOutput

if TYPE_CHECKING:
    from agent.config import Config

log = logging.getLogger("gpu-healthcheck.probes")
T = TypeVar("T")

# Kept free under timeouts.check, so that the engine's own bound never fires first: a killed tool
# stuck in the driver is waited for 5 s before it is left to be reaped later (command.py).
RETRY_MARGIN_S = 6.0
RETRY_MIN_S = 1.0  # a second try with less time than this is not made
NVML = "nvml"  # the tool name of an NVML inventory read in the tool histogram


class LiveSource:
    """Reads the live node: NVML first, nvidia-smi as the fallback, /dev/kmsg, /sys."""

    def __init__(
        self,
        cfg: Config,
        sys_root: Path = Path("/sys"),
        kmsg_path: str = "/dev/kmsg",
        use_nvml: bool = True,
        node_loader: Callable[[], Probed[NodeObject]] | None = None,
        instance_type: str | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.cfg = cfg  # the timeouts are read from it, never copied
        self.telemetry: Telemetry = telemetry or NoTelemetry()
        self._second_try_answered = False  # the last read was a second try that answered (logged once)
        self.sys_root = sys_root
        self.kmsg_path = kmsg_path
        self.use_nvml = use_nvml
        self.node_loader = node_loader
        self._instance_type = instance_type
        self.memo = ParseMemo()
        self.kernel_tail = KernelTail(kmsg_path, device=True)

    @property
    def timeout_s(self) -> float:  # nvidia-smi (timeouts.nvidiaSmi)
        return self.cfg.timeouts.nvidia_smi

    @property
    def nvml_timeout_s(self) -> float:  # timeouts.nvml
        return self.cfg.timeouts.nvml

    @property
    def check_timeout_s(self) -> float:  # timeouts.check: bounds a read with its second try
        return self.cfg.timeouts.check

    def apply_config(self, old: Config, new: Config) -> None:
        """A reload (config/live_part.py): the next read waits by the new timeouts."""
        self.cfg = new

    def run(self, output: ToolOutput[Any], timeout_s: float | None = None) -> CommandOutput | ProbeError:
        return run_command(list(output.argv), self.timeout_s if timeout_s is None else timeout_s)

    def text(self, output: ToolOutput[Any], timeout_s: float | None = None) -> str | ProbeError:
        out = self.run(output, timeout_s)
        if isinstance(out, ProbeError):
            return out
        if out.returncode != 0 and not out.stdout.strip():
            msg = (out.stderr.strip() or f"exit code {out.returncode}").splitlines()[0]
            return ProbeError(output.source, ProbeErrorKind.TOOL_FAILED, msg)
        if output.lost_lines_on_stderr:
            return with_lost_lines(out.stdout, out.stderr)
        return out.stdout

    def read(self, output: ToolOutput[T], timeout_s: float | None = None) -> Probed[T]:
        """A tool output (probes/tool_outputs.py) as its command prints it now, parsed; re-parsed
        only when it changed. The snapshot source parses the file capture wrote with the same parser."""
        return self.memo.parse(output.source, self.text(output, timeout_s), output.parse)

    def gpus(self) -> Probed[GpuInventory]:
        """NVML, else nvidia-smi; after a timeout, one second try from nvidia-smi (see the module).
        A read that worked carries the time it was taken (counter rates)."""
        got = self._gpus()
        return replace(got, taken_at=time.monotonic()) if isinstance(got, GpuInventory) else got

    def _gpus(self) -> Probed[GpuInventory]:
        started = time.monotonic()
        first: Probed[GpuInventory] | None = None
        if self.use_nvml:
            first = self._timed(NVML, self.nvml_timeout_s, _read_nvml)
            if _kind(first) is ProbeErrorKind.UNAVAILABLE:
                first = None
        if first is None:
            first = self._xml(self.timeout_s)
        if _kind(first) is not ProbeErrorKind.TIMEOUT:
            self._second_try_answered = False
            return first
        assert isinstance(first, ProbeError)
        left = self.check_timeout_s - (time.monotonic() - started) - RETRY_MARGIN_S
        limit = min(self.timeout_s, left)
        if limit < min(self.timeout_s, RETRY_MIN_S):
            return _with_note(first, "no second try: timeouts.check leaves no time for one")
        second = self._xml(limit)
        kind = _kind(second)
        if kind is ProbeErrorKind.UNAVAILABLE:
            return _with_note(first, f"no second try: {second}")
        if kind is ProbeErrorKind.TIMEOUT:
            assert isinstance(second, ProbeError)
            return _with_note(first, f"second try, {second.source}: {second.message}")
        # Said once while it lasts (an NVML call stuck for hours would say it every cycle).
        level = logging.DEBUG if self._second_try_answered else logging.WARNING
        self._second_try_answered = True
        log.log(
            level,
            f"{first.source} timed out ({first.message}); the second try, {GPU_XML.source}, answered: "
            "judged on its read",
            extra={"event": "retry"},
        )
        return second

    def _xml(self, timeout_s: float) -> Probed[GpuInventory]:
        return self.memo.parse(
            GPU_XML.source, self._timed(GPU_XML.source, timeout_s, self._xml_text), GPU_XML.parse
        )

    def _xml_text(self, timeout_s: float) -> str | ProbeError:
        return self.text(GPU_XML, timeout_s)

    def _timed(self, tool: str, timeout_s: float, read: Callable[[float], T | ProbeError]) -> T | ProbeError:
        """A GPU inventory read (the read whose timeout is judged), timed for the tool histogram.
        A tool that is not there, or an NVML read refused at once because an earlier one is still
        stuck in the driver, made no read: not observed."""
        started = time.monotonic()
        got = read(timeout_s)
        seconds = time.monotonic() - started
        kind = got.kind if isinstance(got, ProbeError) else None
        if kind is None:  # a read that waited for a hung GPU was given up on at its limit there
            waited = isinstance(got, GpuInventory) and any(h.waited_s is not None for h in got.hung)
            self.telemetry.record_tool_read(
                tool, ToolOutcome.READ_TIMEOUT if waited else ToolOutcome.READ_OK, seconds
            )
        elif kind is ProbeErrorKind.TOOL_FAILED:
            self.telemetry.record_tool_read(tool, ToolOutcome.READ_FAILED, seconds)
        elif kind is ProbeErrorKind.TIMEOUT and seconds >= timeout_s:
            self.telemetry.record_tool_read(tool, ToolOutcome.READ_TIMEOUT, seconds)
        return got

    def topo(self) -> Probed[TopoMatrix]:
        """NVML and sysfs where NVML answers; `nvidia-smi topo -m` where it cannot be loaded or
        does not answer (agent.probes.nvml_topo)."""
        if self.use_nvml:
            from agent.probes.nvml_topo import SOURCE, read_nvml_topo

            got = _nvml_tier(SOURCE, lambda: read_nvml_topo(self.nvml_timeout_s, self.sys_root))
            if got is not None:
                return got
        return self.read(TOPO)

    def nvlink(self) -> Probed[NvlinkReport]:
        """NVML link fields where NVML answers; `nvidia-smi nvlink -s` otherwise (nvml_links)."""
        if self.use_nvml:
            from agent.probes.nvml_links import SOURCE, read_nvlink_status

            got = _nvml_tier(SOURCE, lambda: read_nvlink_status(self.nvml_timeout_s))
            if got is not None:
                return got
        return self.read(NVLINK)

    def kernel(self) -> Probed[KernelXids]:
        """/dev/kmsg, opened once and read on from where the last read stopped (kernel_tail)."""
        if not os.path.exists(self.kmsg_path):
            return ProbeError(self.kmsg_path, ProbeErrorKind.UNAVAILABLE, "not present (mount /dev/kmsg)")
        return read_kernel_tail(self.kernel_tail, self.kmsg_path)

    def rdma(self) -> Probed[RdmaSample]:
        class_dir = self.sys_root / "class" / "infiniband"
        if not class_dir.is_dir():
            # No RDMA devices at all on this node: an empty sample, so the EFA count rule can judge it.
            return RdmaSample(devices=(), taken_at=time.monotonic())
        return read_rdma_tree(class_dir, self.sys_root / "bus" / "pci" / "devices")

    def pci(self) -> Probed[PciSample]:
        return read_pci_tree(self.sys_root / "bus" / "pci" / "devices")

    def nvlink_errors(self) -> Probed[NvlinkErrorSample]:
        if not self.use_nvml:
            return NotCaptured("NVLink error counters (NVML switched off)")
        return _read_nvlink_errors(self.timeout_s)

    def host(self) -> Probed[HostInfo]:
        return read_host_tree(self.sys_root / "devices" / "system")

    def node(self) -> Probed[NodeObject]:
        if self.node_loader is None:
            return NotCaptured("Node object (no API access)")
        return self.node_loader()

    def dcgm_diag(self) -> Probed[DiagReport]:
        return NotCaptured("dcgm diag (runs in the agent's dcgm-diag tier)")

    def dra(self) -> Probed[DraSlices]:
        """The agent reads them from the API (reporters/published_slices.py); a probe cannot."""
        return NotCaptured("ResourceSlices (no API access)")

    def boot_id(self) -> str | None:
        try:
            return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
        except OSError:
            return None

    def instance_type(self) -> str | None:
        return self._instance_type or os.environ.get("GPU_HEALTHCHECK_INSTANCE_TYPE") or None


def _kind(probed: object) -> ProbeErrorKind | None:
    return probed.kind if isinstance(probed, ProbeError) else None


def _with_note(err: ProbeError, note: str) -> ProbeError:
    return ProbeError(err.source, err.kind, f"{err.message}; {note}", err.partial)


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


def _nvml_tier(source: str, read: Callable[[], T]) -> Probed[T] | None:
    """A topology input read through NVML; None where NVML cannot be loaded or does not answer
    (the caller reads the nvidia-smi text). A hang or a driver NVML cannot start is not retried
    through nvidia-smi, which calls the same library."""
    try:
        return read()
    except NvmlUnavailable:
        return None
    except ProbeTimeout as exc:
        return ProbeError(source, ProbeErrorKind.TIMEOUT, str(exc))
    except ToolReportedFailure as exc:
        return ProbeError(source, ProbeErrorKind.TOOL_FAILED, str(exc))


def _read_nvlink_errors(timeout_s: float) -> Probed[NvlinkErrorSample]:
    """NVLink error counters through NVML; not captured where NVML cannot be loaded."""
    from agent.probes.nvlink_errors import SOURCE, read_nvlink_errors

    try:
        return read_nvlink_errors(timeout_s)
    except NvmlUnavailable as exc:
        return NotCaptured(f"NVLink error counters ({exc})")
    except ProbeTimeout as exc:
        return ProbeError(SOURCE, ProbeErrorKind.TIMEOUT, str(exc))
    except ToolReportedFailure as exc:
        return ProbeError(SOURCE, ProbeErrorKind.TOOL_FAILED, str(exc))
