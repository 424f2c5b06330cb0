"""NVLink error counters (replay, recovery, CRC flit, CRC data) of every active link, through NVML.

`nvidia-smi nvlink -e` prints them too, in a layout no recording here shows, so the live read uses
NVML (nvmlDeviceGetNvLinkState / nvmlDeviceGetNvLinkErrorCounter) and a snapshot keeps the read as
our own JSON (nvlink-errors.json). Like the inventory read, the NVML calls run in a worker thread
the caller waits for at most `timeout_s`.
"""

from __future__ import annotations

import json
import time
from types import ModuleType
from typing import Any

from agent.core.model import NvlinkErrorCounts, NvlinkErrorSample, normalize_pci
from agent.core.probed import ParseError
from agent.probes.bounded import Bounded, StillStuck, TimedOut
from agent.probes.nvml import nvml_session
from agent.probes.nvsmi_errors import ProbeTimeout

SOURCE = "nvml nvlink error counters"
COUNTERS = {"replay": 0, "recovery": 1, "crc_flit": 2, "crc_data": 3}  # NVML_NVLINK_ERROR_DL_*
MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS
_WATCHDOG = Bounded()


def read_nvlink_errors(timeout_s: float) -> NvlinkErrorSample:
    """Raises NvmlUnavailable (no pynvml / libnvidia-ml), ToolReportedFailure (NVML cannot start),
    ProbeTimeout (NVML hung)."""
    try:
        return _WATCHDOG.run(SOURCE, _collect, timeout_s, thread_name="nvml-nvlink-errors")
    except StillStuck:
        raise ProbeTimeout("an earlier NVLink counter read is still hung in the driver") from None
    except TimedOut:
        raise ProbeTimeout(f"NVML did not answer within {timeout_s:g} s") from None


def _collect() -> NvlinkErrorSample:
    with nvml_session() as nv:  # the same start and stop as the GPU inventory's
        return _sample(nv)


def _call(nv: ModuleType, name: str, *args: Any) -> Any:
    try:
        return getattr(nv, name)(*args)
    except nv.NVMLError:
        return None  # not supported, link absent, GPU lost: the inventory read says the rest


def _sample(nv: ModuleType) -> NvlinkErrorSample:
    gpus: list[NvlinkErrorCounts] = []
    count = _call(nv, "nvmlDeviceGetCount") or 0
    for index in range(int(count)):
        handle = _call(nv, "nvmlDeviceGetHandleByIndex", index)
        pci = (
            getattr(_call(nv, "nvmlDeviceGetPciInfo", handle), "busId", None) if handle is not None else None
        )
        if handle is None or pci is None:
            continue
        links: dict[int, dict[str, int]] = {}
        for link in range(MAX_LINKS):
            if _call(nv, "nvmlDeviceGetNvLinkState", handle, link) != 1:
                continue  # inactive or not there: the nvlink check counts inactive links
            values = {
                name: _call(nv, "nvmlDeviceGetNvLinkErrorCounter", handle, link, c)
                for name, c in COUNTERS.items()
            }
            links[link] = {k: int(v) for k, v in values.items() if isinstance(v, int)}
        text = pci.decode() if isinstance(pci, bytes) else str(pci)
        gpus.append(NvlinkErrorCounts(index=index, pci_bus_id=normalize_pci(text), links=links))
    return NvlinkErrorSample(gpus=tuple(gpus), taken_at=time.monotonic())


def to_json(sample: NvlinkErrorSample) -> str:
    """The snapshot file: the counters as read (taken_at is not kept: a replay has one sample)."""
    doc = [
        {"index": g.index, "pci": g.pci_bus_id, "links": {str(n): c for n, c in g.links.items()}}
        for g in sample.gpus
    ]
    return json.dumps({"gpus": doc}, indent=1) + "\n"


def parse_nvlink_errors_json(text: str) -> NvlinkErrorSample:
    try:
        doc = json.loads(text)
        gpus = tuple(
            NvlinkErrorCounts(
                index=int(g["index"]),
                pci_bus_id=normalize_pci(str(g["pci"])),
                links={int(n): {str(k): int(v) for k, v in c.items()} for n, c in g["links"].items()},
            )
            for g in doc["gpus"]
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ParseError(f"not an NVLink error counter file: {exc}") from None
    return NvlinkErrorSample(gpus=gpus, taken_at=0.0)
