"""The `nvidia-smi topo -m` matrix built from NVML and sysfs, into the model the text parser gives,
so that the topology check judges it unchanged.

GPU pairs: NV<n> where n active NVLinks join them (links whose remote end is the other GPU; on an
NVSwitch board every GPU reaches every other through its switch links, and topo -m shows NV<links>),
else the PCIe level of nvmlDeviceGetTopologyCommonAncestor. GPU-NIC and NIC-NIC: sysfs
(agent.probes.topo_sysfs). Affinity: nvmlDeviceGetCpuAffinity and nvmlDeviceGetMemoryAffinity
(NUMA node scope), printed as nvidia-smi prints them ("0-47,96-143", "0"; "N/A" where unanswered).

What does not change within a driver load (the PCIe ancestors, the links' remote ends, the
affinities) is kept on the session; a read asks NVML only for the link states, one field-value
call per GPU. Where NVML does not answer (NotAnswered) the caller reads `nvidia-smi topo -m`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agent.core.pci import normalize_pci
from agent.core.topo import TopoMatrix
from agent.probes.bounded import Bounded
from agent.probes.nvml_links import NotAnswered, read_links
from agent.probes.nvml_session import Opened, bounded_read, check_session, describe, text
from agent.probes.topo_sysfs import PciPlace, cpu_ranges, level, place, rdma_nics, sysfs_bdf

SOURCE = "nvml topology"
# nvmlGpuTopologyLevel_t → the topo -m code (INTERNAL: two GPUs on one board, behind one bridge)
_LEVELS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
_REMOTE_GPU, _REMOTE_SWITCH = 0, 2  # nvmlIntNvLinkDeviceType_t
_SCOPE_NODE = 0  # NVML_SCOPE_NODE
# unsigned longs in the CPU and node sets asked for: 1024 CPUs at least (read once per driver load)
_WORDS = max(16, ((os.cpu_count() or 0) + 63) // 64)


def _call(opened: Opened, name: str, *args: Any) -> Any:
    nv = opened.nv
    fn = getattr(nv, name, None)
    if fn is None:
        raise NotAnswered(f"NVML: this nvidia-ml-py has no {name}")
    try:
        return fn(*args)
    except nv.NVMLError as exc:
        check_session(exc)
        raise NotAnswered(f"NVML: {name}: {describe(exc)}") from None


def _optional(opened: Opened, name: str, *args: Any) -> Any:
    try:
        return _call(opened, name, *args)
    except NotAnswered:
        return None


def _mask(words: Any) -> list[int]:
    return [64 * w + bit for w, word in enumerate(words or ()) for bit in range(64) if int(word) >> bit & 1]


def _fixed(opened: Opened, count: int) -> dict[str, Any]:
    """What stays for the driver load: PCI ids, affinities, PCIe ancestors, NVLink remote ends."""
    fixed: dict[str, Any] | None = opened.cache.get("topo")
    if fixed is not None and len(fixed["pci"]) == count:
        return fixed
    handles = [opened.handle(i) for i in range(count)]
    pcis = []
    for h in handles:
        bus = text(getattr(_call(opened, "nvmlDeviceGetPciInfo", h), "busId", None))
        if bus is None:
            raise NotAnswered("NVML: a GPU without a PCI bus id")
        pcis.append(normalize_pci(bus))
    cpus = [_mask(_optional(opened, "nvmlDeviceGetCpuAffinity", h, _WORDS)) for h in handles]
    numa = [_mask(_optional(opened, "nvmlDeviceGetMemoryAffinity", h, _WORDS, _SCOPE_NODE)) for h in handles]
    fixed = {
        "pci": pcis,
        "cpu": [cpu_ranges(c) or "N/A" for c in cpus],
        "numa": [cpu_ranges(n) or "N/A" for n in numa],
        "ancestors": {},  # asked for the pairs NVLink does not join, once
        "remote": {},
    }
    opened.cache["topo"] = fixed
    return fixed


def _ancestor(opened: Opened, fixed: dict[str, Any], pair: tuple[int, int]) -> str:
    """The PCIe path between two GPUs (nvmlDeviceGetTopologyCommonAncestor), as topo -m names it."""
    if pair not in fixed["ancestors"]:
        a, b = (opened.handle(i) for i in pair)
        got = int(_call(opened, "nvmlDeviceGetTopologyCommonAncestor", a, b))
        fixed["ancestors"][pair] = _LEVELS.get(got, "SYS")
    cell: str = fixed["ancestors"][pair]
    return cell


def _remote(opened: Opened, fixed: dict[str, Any], index: int, link: int) -> tuple[int | None, str | None]:
    """The far end of an active link: (device type, PCI bus id), asked once per driver load."""
    key = (index, link)
    if key not in fixed["remote"]:
        h = opened.handle(index)
        kind = _optional(opened, "nvmlDeviceGetNvLinkRemoteDeviceType", h, link)
        bus = text(getattr(_optional(opened, "nvmlDeviceGetNvLinkRemotePciInfo", h, link), "busId", None))
        fixed["remote"][key] = (kind if isinstance(kind, int) else None, normalize_pci(bus) if bus else None)
    got: tuple[int | None, str | None] = fixed["remote"][key]
    return got


def _nvlinks(opened: Opened, fixed: dict[str, Any], count: int) -> dict[tuple[int, int], int]:
    """Active NVLinks joining each GPU pair (a < b)."""
    pcis: list[str] = fixed["pci"]
    to_gpu: list[dict[int, int]] = []
    to_switch: list[int] = []
    for index in range(count if count > 1 else 0):  # one GPU: no pair to join
        links = read_links(opened.nv, opened.handle(index))
        peers: dict[int, int] = {}
        switch = 0
        for link, up in links.active.items() if links is not None else ():
            if not up:
                continue
            kind, bus = _remote(opened, fixed, index, link)
            if bus in pcis and kind in (None, _REMOTE_GPU):
                peer = pcis.index(bus)
                peers[peer] = peers.get(peer, 0) + 1
            elif kind == _REMOTE_SWITCH or kind is None:
                switch += 1
        to_gpu.append(peers)
        to_switch.append(switch)
    out = {}
    for a in range(count):
        for b in range(a + 1, count):
            n = to_gpu[a].get(b, 0) or (
                min(to_switch[a], to_switch[b]) if to_switch[a] and to_switch[b] else 0
            )
            if n:
                out[(a, b)] = n
    return out


def topo_matrix(opened: Opened, sys_root: Path) -> TopoMatrix:
    """The matrix topo -m prints, from NVML (GPUs) and sysfs under sys_root (NICs)."""
    count = int(_call(opened, "nvmlDeviceGetCount"))
    if count == 0:
        raise NotAnswered("NVML lists no GPU")
    try:
        fixed = _fixed(opened, count)
    except opened.nv.NVMLError as exc:  # attaching a GPU failed: the inventory read says why
        check_session(exc)
        opened.retire()
        raise NotAnswered(f"NVML: {describe(exc)}") from None
    nv_pairs = _nvlinks(opened, fixed, count)
    gpus = [f"GPU{i}" for i in range(count)]
    nics = rdma_nics(sys_root)
    nic_cols = [f"NIC{k}" for k in range(len(nics))]
    devices = sys_root / "bus" / "pci" / "devices"
    places: dict[str, PciPlace | None] = {
        **{g: place(devices, sysfs_bdf(fixed["pci"][i])) for i, g in enumerate(gpus)},
        **{c: place(devices, bdf) for c, (_, bdf) in zip(nic_cols, nics, strict=True)},
    }
    columns = gpus + nic_cols
    rows: dict[str, dict[str, str]] = {c: {} for c in columns}
    for i, a in enumerate(columns):
        for j, b in enumerate(columns):
            if i == j:
                cell = "X"
            elif i < count and j < count:
                pair = (min(i, j), max(i, j))
                cell = f"NV{nv_pairs[pair]}" if pair in nv_pairs else _ancestor(opened, fixed, pair)
            else:
                pa, pb = places[a], places[b]
                if pa is None or pb is None:
                    raise NotAnswered(f"sysfs: no PCI device for {a if pa is None else b}")
                cell = level(pa, pb)
            rows[a][b] = cell
    return TopoMatrix(
        columns=tuple(columns),
        rows=rows,
        nic_names={c: name for c, (name, _) in zip(nic_cols, nics, strict=True)},
        cpu_affinity={g: fixed["cpu"][i] for i, g in enumerate(gpus)},
        numa_affinity={g: fixed["numa"][i] for i, g in enumerate(gpus)},
        source=SOURCE,
    )


_WATCHDOG = Bounded()


def read_nvml_topo(timeout_s: float, sys_root: Path) -> TopoMatrix:
    """Raises NotAnswered / NvmlUnavailable (read `nvidia-smi topo -m` instead), ProbeTimeout,
    ToolReportedFailure."""
    return bounded_read(
        _WATCHDOG,
        SOURCE,
        lambda opened: topo_matrix(opened, sys_root),
        timeout_s,
        what="NVML topology read",
        thread="nvml-topology",
    )
