"""Read the GPU inventory live through NVML (pynvml, PyPI nvidia-ml-py), into the same model the
nvidia-smi parsers produce.

The read runs on the NVML session kept open across reads (agent.probes.nvml_session). NVML calls
can block for minutes on a dying GPU, so the whole read runs in a daemon worker thread and the
caller waits at most `timeout_s`. A read that hangs is abandoned (its thread cannot be killed);
while it is still stuck, later reads fail fast with ProbeTimeout instead of piling up more stuck
threads inside the driver."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from agent.core.gpu import Gpu, GpuInventory, LostGpu
from agent.core.pci import normalize_pci
from agent.probes.bounded import Bounded
from agent.probes.gpu_fields import model_parts
from agent.probes.gpu_fields import read_nvml as read_fields
from agent.probes.gpu_fields_nvml import Device
from agent.probes.nvml_session import GpuLost, Opened, bounded_read, check_session, describe, optional, text
from agent.probes.nvsmi_errors import ToolReportedFailure

SOURCE = "nvml"

_WATCHDOG = Bounded()  # parks the workers abandoned after a timeout, still inside NVML


def read_nvml(timeout_s: float) -> GpuInventory:
    """Read every GPU through NVML within timeout_s, on the session kept open (nvml_session).

    Raises ProbeTimeout when NVML does not answer in time, ToolReportedFailure when NVML cannot
    start (driver not loaded, driver/library version mismatch), NvmlUnavailable when the library is
    missing. A GPU that NVML lists but cannot talk to (GPU_IS_LOST, RESET_REQUIRED, UNKNOWN on its
    handle) is a LostGpu; such a read, or one that finds a GPU asking for a reset, retires the
    session so that the next read attaches afresh.
    """
    return bounded_read(_WATCHDOG, SOURCE, _inventory, timeout_s, what="NVML read", thread="nvml-read")


def _inventory(opened: Opened) -> GpuInventory:
    nv = opened.nv
    try:
        count = int(nv.nvmlDeviceGetCount())
    except nv.NVMLError as exc:
        check_session(exc)
        opened.retire()
        raise ToolReportedFailure(f"NVML: cannot count GPUs ({describe(exc)})") from None
    gpus: list[Gpu] = []
    lost: list[LostGpu] = []
    for index in range(count):
        got = _read_gpu(opened, index)
        if isinstance(got, LostGpu):
            lost.append(got)
        else:
            gpus.append(got)
    if lost or any(_wants_reset(g) for g in gpus):
        opened.retire()  # attach afresh next time, and hold no handle on a GPU awaiting a reset
    return GpuInventory(
        source=SOURCE,
        driver_version=opened.driver_version,
        cuda_version=_cuda_version(nv),
        attached_gpus=count,
        gpus=tuple(gpus),
        lost=tuple(lost),
    )


def _wants_reset(gpu: Gpu) -> bool:
    return bool(gpu.reset_required or gpu.drain_and_reset_recommended) or gpu.recovery_action not in (
        None,
        "None",
    )


def _cuda_version(nv: ModuleType) -> str | None:
    raw = optional(nv, getattr(nv, "nvmlSystemGetCudaDriverVersion", None))
    if not isinstance(raw, int) or raw <= 0:
        return None
    return f"{raw // 1000}.{(raw % 1000) // 10}"


def _read_gpu(opened: Opened, index: int) -> Gpu | LostGpu:
    nv = opened.nv
    try:
        handle = opened.handle(index)
    except nv.NVMLError as exc:
        check_session(exc)
        return LostGpu(pci_bus_id=None, message=f"GPU {index}: nvmlDeviceGetHandleByIndex: {describe(exc)}")

    def call(fn_name: str, *args: Any, basic: bool = False) -> Any:
        return optional(nv, getattr(nv, fn_name, None), handle, *args, basic=basic)

    device = Device(call, nv)
    pci: str | None = None
    try:
        info = device.get("nvmlDeviceGetPciInfo", basic=True)
        bus = text(getattr(info, "busId", None)) if info is not None else None
        pci = normalize_pci(bus) if bus else None
        values = read_fields(device, after_identity=lambda: _has_pci(pci))
        assert pci is not None
        return Gpu(index=index, pci_bus_id=pci, **model_parts(values))
    except GpuLost as lost:
        return LostGpu(pci_bus_id=pci, message=f"GPU {index}: {lost}")


def _has_pci(pci: str | None) -> None:
    if pci is None:
        raise GpuLost("nvmlDeviceGetPciInfo: no PCI bus id")
