"""`nvidia-smi topo -m` (or its NVML and sysfs equivalent): which GPU and NIC sit under which PCIe switch,
CPU and NUMA node."""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.core.probed import SourceLine


@dataclass(frozen=True)
class TopoMatrix:
    """`nvidia-smi topo -m`. rows maps a device name ("GPU0", "NIC3") to its cells by column name."""

    columns: tuple[str, ...]  # device columns in header order: GPU0.., NIC0..
    rows: dict[str, dict[str, str]]
    nic_names: dict[str, str] = field(default_factory=dict)  # "NIC0" -> "mlx5_0" / "rdmap79s0"
    cpu_affinity: dict[str, str] = field(default_factory=dict)
    numa_affinity: dict[str, str] = field(default_factory=dict)
    row_lines: dict[str, SourceLine] = field(default_factory=dict, compare=False, repr=False)
    header_line: SourceLine | None = field(default=None, compare=False, repr=False)
    source: str = "nvidia-smi topo -m"

    @property
    def gpu_rows(self) -> tuple[str, ...]:
        return tuple(r for r in self.rows if r.startswith("GPU"))

    @property
    def nic_rows(self) -> tuple[str, ...]:
        return tuple(r for r in self.rows if r.startswith("NIC"))
