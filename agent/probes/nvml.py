"""Read the GPU inventory live through NVML (pynvml, PyPI nvidia-ml-py), into the same model the
nvidia-smi parsers produce.

The read runs on the NVML session kept open across reads (agent.probes.nvml_session). NVML calls
can block for minutes on a dying GPU, so the whole read runs in a daemon worker thread and the
caller waits at most `timeout_s`. A read that hangs is abandoned (its thread cannot be killed);
while it is still stuck, later reads fail fast with ProbeTimeout instead of piling up more stuck
threads inside the driver.

Inside it each GPU is read in a worker of its own, all at once and waited for until the same
deadline (a little before `timeout_s`), so one GPU whose calls hang costs only that GPU: it is a
HungGpu of the inventory (named by its last read's PCI address) and the others are read as usual.
Its worker is parked and holds its own reference on the session, which is therefore never shut
down under the stuck call; while it is stuck that GPU is not called again (HungGpu at once, no
wait). Only what all GPUs share (the count, the driver version, nvmlInit) still hangs the whole
read."""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

from agent.core.gpu import Gpu, GpuInventory, HungGpu, LostGpu
from agent.core.pci import normalize_pci
from agent.probes.bounded import Bounded, StillStuck, TimedOut
from agent.probes.gpu_fields import model_parts
from agent.probes.gpu_fields import read_nvml as read_fields
from agent.probes.gpu_fields_nvml import Device
from agent.probes.nvml_session import GpuLost, Opened, bounded_read, check_session, describe, optional, text
from agent.probes.nvsmi_errors import ToolReportedFailure

SOURCE = "nvml"

_WATCHDOG = Bounded()  # parks the workers abandoned after a timeout, still inside NVML
_PER_GPU = Bounded()  # the same, per GPU index ("gpu3")
_SEEN: dict[int, tuple[str, str | None]] = {}  # GPU index -> PCI address and UUID of its last read


def read_nvml(timeout_s: float, *, per_gpu_bounds: bool = True) -> GpuInventory:
    """Read every GPU through NVML within timeout_s, on the session kept open (nvml_session).

    Raises ProbeTimeout when NVML does not answer in time, ToolReportedFailure when NVML cannot
    start (driver not loaded, driver/library version mismatch), NvmlUnavailable when the library is
    missing. A GPU that NVML lists but cannot talk to (GPU_IS_LOST, RESET_REQUIRED, UNKNOWN on its
    handle) is a LostGpu; such a read, or one that finds a GPU asking for a reset, retires the
    session so that the next read attaches afresh. A GPU whose calls do not return in time is a
    HungGpu (per_gpu_bounds=False: every GPU in the read's one worker, the old way, which the
    benchmark compares against).
    """
    bound = (time.monotonic(), timeout_s) if per_gpu_bounds else None
    return bounded_read(
        _WATCHDOG, SOURCE, lambda o: _inventory(o, bound), timeout_s, what="NVML read", thread="nvml-read"
    )


def _deadline(bound: tuple[float, float]) -> float:
    """When the per-GPU workers are given up: before the whole read's own timeout."""
    started, timeout_s = bound
    return started + timeout_s - min(1.0, 0.1 * timeout_s)


def _read_each(opened: Opened, count: int, bound: tuple[float, float]) -> list[Gpu | LostGpu | HungGpu]:
    """Every GPU in its own worker (see the module); a GPU still stuck from an earlier read is not
    called. A worker that raised (the session gone, a bug) raises here, as the read did before."""
    readers: dict[str, Any] = {}
    for index in range(count):
        key = f"gpu{index}"
        if not _PER_GPU.parked(key):
            opened.share()

            def read(index: int = index) -> Gpu | LostGpu:
                try:
                    return _read_gpu(opened, index)
                finally:
                    opened.release()

            readers[key] = read
    keys = [f"gpu{i}" for i in range(count)]
    ran = _PER_GPU.run_each(readers, max(0.0, _deadline(bound) - time.monotonic()), thread_prefix="nvml")
    out: list[Gpu | LostGpu | HungGpu] = []
    for index, key in enumerate(keys):
        got: Any = ran.get(key) if key in readers else StillStuck(len(_PER_GPU.parked(key)))
        if isinstance(got, (Gpu, LostGpu)):
            out.append(got)
            continue
        pci, uuid = _SEEN.get(index, (None, None))
        # One text while it lasts (a condition message that does not change costs no write).
        msg = f"NVML calls on this GPU do not return within {bound[1]:g} s; not called again until they do"
        if isinstance(got, TimedOut):
            out.append(HungGpu(index, pci, uuid, msg, waited_s=time.monotonic() - bound[0]))
        elif isinstance(got, StillStuck):
            if key in readers:  # not started after all: give its reference back
                opened.release()
            out.append(HungGpu(index, pci, uuid, msg))
        else:
            assert isinstance(got, BaseException)
            raise got
    return out


def _inventory(opened: Opened, bound: tuple[float, float] | None = None) -> GpuInventory:
    nv = opened.nv
    try:
        count = int(nv.nvmlDeviceGetCount())
    except nv.NVMLError as exc:
        check_session(exc)
        opened.retire()
        raise ToolReportedFailure(f"NVML: cannot count GPUs ({describe(exc)})") from None
    gpus: list[Gpu] = []
    lost: list[LostGpu] = []
    hung: list[HungGpu] = []
    # A read whose caller already gave up (stuck in the count or nvmlInit until now) finishes as
    # before, in its own worker: nobody waits for it, and no GPU is called hung for its lateness.
    each: list[Gpu | LostGpu | HungGpu]
    if bound is None or time.monotonic() >= _deadline(bound):
        each = [_read_gpu(opened, index) for index in range(count)]
    else:
        each = _read_each(opened, count, bound)
    for got in each:
        if isinstance(got, LostGpu):
            lost.append(got)
        elif isinstance(got, HungGpu):
            hung.append(got)
        else:
            gpus.append(got)
            _SEEN[got.index] = (got.pci_bus_id, got.uuid)
    if lost or any(_wants_reset(g) for g in gpus):
        opened.retire()  # attach afresh next time, and hold no handle on a GPU awaiting a reset
    return GpuInventory(
        source=SOURCE,
        driver_version=opened.driver_version,
        cuda_version=_cuda_version(nv),
        attached_gpus=count,
        gpus=tuple(gpus),
        lost=tuple(lost),
        hung=tuple(hung),
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
        if pci is not None and _SEEN.get(index, ("", None))[0] != pci:
            _SEEN[index] = (pci, None)  # named by it should a later call of this read hang
        values = read_fields(device, after_identity=lambda: _has_pci(pci))
        assert pci is not None
        return Gpu(index=index, pci_bus_id=pci, **model_parts(values))
    except GpuLost as lost:
        return LostGpu(pci_bus_id=pci, message=f"GPU {index}: {lost}")


def _has_pci(pci: str | None) -> None:
    if pci is None:
        raise GpuLost("nvmlDeviceGetPciInfo: no PCI bus id")
