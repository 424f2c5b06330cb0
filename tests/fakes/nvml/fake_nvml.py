"""The tests' side of the fake libnvidia-ml.so.1 (fake_libnvidia_ml.c): the machine it pretends to be,
written as its configuration file, and its controls (counts of inits, shutdowns and attaches; holding
every call; dropping the library's initialisation).

`from_recordings` derives the machine from real recordings of one node: `nvidia-smi -q` (through the
project's text parser), `nvidia-smi nvlink -s` and `nvidia-smi topo -m` (through theirs), so that the
NVML path and the text path can be compared on the same machine. What NVML would answer where a
recording says nothing is stated at each place below.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from pathlib import Path

from agent.core.gpu import Gpu
from agent.core.nvlink import NvlinkReport
from agent.core.topo import TopoMatrix
from agent.probes.nvsmi_text import parse_nvsmi_text

_ARCH = {"Kepler": 2, "Maxwell": 3, "Pascal": 4, "Volta": 5, "Turing": 6, "Ampere": 7, "Ada Lovelace": 8}
_ARCH |= {"Hopper": 9, "Blackwell": 10}
_RECOVERY = {"None": 0, "Reset": 1, "Reboot": 2, "Drain P2P": 3, "Drain and Reset": 4}
_FABRIC_STATE = {"Not Started": 1, "In Progress": 2, "Completed": 3}
_LEVEL = {"PIX": 10, "PXB": 20, "PHB": 30, "NODE": 40, "SYS": 50, "SOC": 50}
_CLOCK_BITS = {
    "idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake": 0x80,
    "display_clock_setting": 0x100,
}


@dataclass
class Machine:
    driver: str = "580.159.04"
    cuda: int = 13000
    gpus: list[dict[str, str]] = field(default_factory=list)
    init_error: int | None = None

    def text(self) -> str:
        lines = [f"driver {self.driver}", f"cuda {self.cuda}"]
        if self.init_error is not None:
            lines.append(f"init_error {self.init_error}")
        for gpu in self.gpus:
            lines.append("gpu")
            lines += [f"{k} {v}" for k, v in gpu.items()]
        return "\n".join(lines) + "\n"


def _put(spec: dict[str, str], key: str, value: object) -> None:
    if value is None:
        return
    spec[key] = str(int(value)) if isinstance(value, bool) else str(value)


def gpu_spec(gpu: Gpu) -> dict[str, str]:
    """What NVML answers for a GPU that nvidia-smi -q described as `gpu` (absent: NOT_SUPPORTED)."""
    s: dict[str, str] = {"pci": gpu.pci_bus_id.upper()}  # NVML prints the hex digits upper case
    for key, value in (("name", gpu.name), ("uuid", gpu.uuid), ("serial", gpu.serial)):
        _put(s, key, value)
    _put(s, "arch", _ARCH.get(gpu.architecture or ""))
    _put(s, "persistence", gpu.persistence_mode)
    if gpu.mig_mode is not None:
        s["mig"] = f"{int(gpu.mig_mode)} {int(gpu.mig_mode)}"
    e = gpu.ecc
    if e.mode_enabled is not None:
        s["ecc"] = f"{int(e.mode_enabled)} {int(e.mode_enabled)}"
    for (err, counter, loc), value in {
        (1, 0, 2): e.volatile_dram_uncorrectable,
        (1, 1, 2): e.aggregate_dram_uncorrectable,
        (0, 0, 2): e.volatile_dram_correctable,
        (0, 1, 2): e.aggregate_dram_correctable,
        (1, 0, 7): e.volatile_sram_uncorrectable,
        (1, 1, 7): e.aggregate_sram_uncorrectable,
        (0, 0, 7): e.volatile_sram_correctable,
        (0, 1, 7): e.aggregate_sram_correctable,
    }.items():
        _put(s, f"memerr.{err}.{counter}.{loc}", value)
    _put(s, "totalecc.1.0", e.volatile_double_bit_total)
    _put(s, "totalecc.1.1", e.aggregate_double_bit_total)
    _put(s, "totalecc.0.0", e.volatile_single_bit_total)
    if gpu.retired_pages is not None:
        _put(s, "retired.0", gpu.retired_pages.single_bit)
        _put(s, "retired.1", gpu.retired_pages.double_bit)
        _put(s, "retired_pending", gpu.retired_pages.pending)
    r = gpu.remapped_rows
    if r is not None:
        s["remapped"] = f"{r.correctable} {r.uncorrectable} {int(r.pending)} {int(r.failure)}"
        h = r.histogram
        if h is not None:
            s["remap_hist"] = f"{h.max} {h.high} {h.partial} {h.low} {h.none}"
    ce = gpu.clock_events
    s["clock_reasons"] = str(sum(bit for name, bit in _CLOCK_BITS.items() if getattr(ce, name)))
    p = gpu.pcie
    for key, value in (
        ("pcie_gen_cur", p.gen_current),
        ("pcie_gen_max", p.gen_max),
        ("pcie_width_cur", p.width_current),
        ("pcie_width_max", p.width_max),
        ("pcie_replay", p.replay_counter),
    ):
        _put(s, key, value)
    _put(s, "field.230", _RECOVERY.get(gpu.recovery_action or ""))
    _put(s, "field.226", gpu.reset_required)
    _put(s, "field.227", gpu.drain_and_reset_recommended)
    _put(s, "field.82", gpu.thermal.memory_c)
    if gpu.fabric is not None and gpu.fabric.state in _FABRIC_STATE:
        s["fabric"] = (
            f"{_FABRIC_STATE[gpu.fabric.state]} {0 if gpu.fabric.status in (None, 'Success') else 999}"
        )
    t = gpu.thermal
    _put(s, "temp.0", t.gpu_c)
    _put(s, "temp_threshold.1", t.gpu_slowdown_c)
    _put(s, "temp_threshold.2", t.memory_max_c)
    c = gpu.clocks
    _put(s, "clock.1", c.sm_mhz)
    _put(s, "app_clock.0", c.applications_mhz)
    _put(s, "max_clock.1", c.max_sm_mhz)
    if c.utilization_percent is not None:
        s["util"] = f"{c.utilization_percent} 0"
    w = gpu.power
    if w.performance_state:
        s["pstate"] = w.performance_state.lstrip("P")
    _put(s, "power_limit", round(w.enforced_limit_w * 1000) if w.enforced_limit_w else None)
    _put(s, "power_default", round(w.default_limit_w * 1000) if w.default_limit_w else None)
    _put(s, "power_usage", round(w.draw_w * 1000) if w.draw_w else None)
    return s


def add_nvlink(specs: list[dict[str, str]], report: NvlinkReport, *, links_present: int = 18) -> None:
    """Link fields from an `nvidia-smi nvlink -s` listing. A GPU listed with links: their count
    (field 91), states (165) and speeds in MB/s (164), the far end an NVSwitch. "All links are
    inactive": `links_present` links, all 0. "Does not have or support NVLink": nothing (every link
    field NOT_SUPPORTED). An empty listing (the single-H100 VM): NVML's answer is not recorded; the
    fake says the board has `links_present` links whose state NVML does not answer (ERROR_UNKNOWN)."""
    listed = {g.index: g for g in report.gpus}
    for index, spec in enumerate(specs):
        g = listed.get(index)
        if report.supported is None:
            spec["field.91"] = str(links_present)
            for n in range(links_present):
                spec[f"field.165.{n}"] = "!999"
            continue
        if g is None or (not g.links and not g.all_inactive):
            continue
        count = len(g.links) if g.links else links_present
        spec["field.91"] = str(count)
        for n in range(count):
            speed = g.links.get(n)
            spec[f"field.165.{n}"] = "1" if speed is not None else "0"
            if speed is not None:
                spec[f"field.164.{n}"] = str(round(speed * 1000))
                spec[f"nvlink_remote_type.{n}"] = "2"  # NVSwitch
                spec[f"nvlink_remote_pci.{n}"] = f"00000000:{0xF0 + n % 4:02X}:00.0"


def add_topology(specs: list[dict[str, str]], topo: TopoMatrix) -> None:
    """Affinities and PCIe ancestors from a `nvidia-smi topo -m` matrix (its GPU part)."""

    def words(ranges: str) -> str | None:
        if ranges in ("N/A", ""):
            return None
        ids: list[int] = []
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            ids += range(int(lo), int(hi or lo) + 1)
        out = [0] * (max(ids) // 64 + 1)
        for n in ids:
            out[n // 64] |= 1 << (n % 64)
        return " ".join(f"{w:x}" for w in out)

    for index, spec in enumerate(specs):
        row = f"GPU{index}"
        for key, ranges in (("cpuset", topo.cpu_affinity.get(row)), ("nodeset", topo.numa_affinity.get(row))):
            got = words(ranges or "")
            if got is not None:
                spec[key] = got
        for other in range(len(specs)):
            cell = topo.rows.get(row, {}).get(f"GPU{other}", "")
            if other != index and cell in _LEVEL:
                spec[f"topo.{other}"] = str(_LEVEL[cell])


def from_recordings(
    q_text: Path, nvlink: NvlinkReport | None = None, topo: TopoMatrix | None = None
) -> Machine:
    inv = parse_nvsmi_text(q_text.read_text(encoding="utf-8"))
    specs = [gpu_spec(g) for g in inv.gpus]
    if nvlink is not None:
        add_nvlink(specs, nvlink)
    if topo is not None:
        add_topology(specs, topo)
    return Machine(driver=inv.driver_version or "580.159.04", gpus=specs)


class FakeLib:
    """The loaded fake and its controls; `path` is the configuration file it reads."""

    def __init__(self, so: Path, path: Path) -> None:
        self.lib = ctypes.CDLL(str(so), mode=ctypes.RTLD_GLOBAL)
        self.path = path

    def write(self, machine: Machine, *, now: bool = False) -> None:
        self.path.write_text(machine.text(), encoding="utf-8")
        if now:
            assert self.lib.fake_nvml_load(str(self.path).encode()) == 0

    def counts(self) -> dict[str, int]:
        out = (ctypes.c_uint * 6)()
        self.lib.fake_nvml_counts(out)
        names = ("inits", "shutdowns", "attaches", "handle_calls", "calls", "refcount")
        return dict(zip(names, (int(v) for v in out), strict=True))

    def reset(self) -> None:
        self.lib.fake_nvml_reset()

    def hold(self, on: bool) -> None:
        self.lib.fake_nvml_hold(int(on))

    def hold_gpu(self, index: int, on: bool) -> None:
        """Every call on GPU `index` (its attach included) blocks until released: one hung GPU."""
        self.lib.fake_nvml_hold_gpu(index, int(on))

    def uninitialise(self) -> None:
        self.lib.fake_nvml_uninitialise()
