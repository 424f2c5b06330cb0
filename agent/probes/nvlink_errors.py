"""NVLink error counters (replay, recovery, CRC flit, CRC data) of every active link, through NVML.

`nvidia-smi nvlink -e` prints them too, in a layout no recording here shows, so the live read uses
NVML and a snapshot keeps the read as our own JSON (nvlink-errors.json). The counters come from
one nvmlDeviceGetFieldValues call per GPU (agent.probes.nvml_links: NVML_FI_DEV_NVLINK_ERROR_DL_*
scoped by link; the data-CRC counter exists as a field for links 0-11 only); where the driver does
not answer field values, from nvmlDeviceGetNvLinkState / nvmlDeviceGetNvLinkErrorCounter per link.
Like the inventory read, it runs on the kept NVML session in a worker thread the caller waits for
at most `timeout_s`.
"""

from __future__ import annotations

import json
import time
from types import ModuleType
from typing import Any

from agent.core.nvlink import NvlinkErrorCounts, NvlinkErrorSample
from agent.core.pci import normalize_pci
from agent.core.probed import ParseError
from agent.probes.bounded import Bounded
from agent.probes.nvml_links import MAX_LINKS, Links, NotAnswered, read_links
from agent.probes.nvml_session import Opened, bounded_read, check_session

SOURCE = "nvml nvlink error counters"
COUNTERS = {"replay": 0, "recovery": 1, "crc_flit": 2, "crc_data": 3}  # NVML_NVLINK_ERROR_DL_*
_WATCHDOG = Bounded()


def read_nvlink_errors(timeout_s: float) -> NvlinkErrorSample:
    """Raises NvmlUnavailable (no pynvml / libnvidia-ml), ToolReportedFailure (NVML cannot start),
    ProbeTimeout (NVML hung)."""
    return bounded_read(
        _WATCHDOG, SOURCE, _sample, timeout_s, what="NVLink counter read", thread="nvml-nvlink-errors"
    )


def _call(nv: ModuleType, name: str, *args: Any) -> Any:
    try:
        return getattr(nv, name)(*args)
    except nv.NVMLError as exc:
        check_session(exc)
        return None  # not supported, link absent, GPU lost: the inventory read says the rest


def _legacy_links(nv: ModuleType, handle: Any) -> dict[int, dict[str, int]]:
    """A call per link and counter, for drivers that do not answer the link fields."""
    links: dict[int, dict[str, int]] = {}
    for link in range(MAX_LINKS):
        if _call(nv, "nvmlDeviceGetNvLinkState", handle, link) != 1:
            continue  # inactive or not there: the nvlink check counts inactive links
        values = {
            name: _call(nv, "nvmlDeviceGetNvLinkErrorCounter", handle, link, c)
            for name, c in COUNTERS.items()
        }
        links[link] = {k: int(v) for k, v in values.items() if isinstance(v, int)}
    return links


def _links(opened: Opened, index: int, handle: Any) -> dict[int, dict[str, int]]:
    by_call = ("nvlink counters by call", index)
    if not opened.cache.get(by_call):
        got: Links | bool | None
        try:
            got = read_links(opened.nv, handle, counters=True)
        except NotAnswered:
            got = False
        if got is None:
            return {}  # no NVLink
        if isinstance(got, Links) and (any(got.counters.values()) or not any(got.active.values())):
            return {n: c for n, c in got.counters.items() if got.active[n]}
        opened.cache[by_call] = True  # this driver load answers no link counter field: ask per link
    return _legacy_links(opened.nv, handle)


def _sample(opened: Opened) -> NvlinkErrorSample:
    nv = opened.nv
    gpus: list[NvlinkErrorCounts] = []
    count = _call(nv, "nvmlDeviceGetCount") or 0
    for index in range(int(count)):
        try:
            handle = opened.handle(index)
        except nv.NVMLError as exc:
            check_session(exc)
            continue
        pci = getattr(_call(nv, "nvmlDeviceGetPciInfo", handle), "busId", None)
        if pci is None:
            continue
        text = pci.decode() if isinstance(pci, bytes) else str(pci)
        links = _links(opened, index, handle)
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
