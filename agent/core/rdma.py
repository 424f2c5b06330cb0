"""RDMA adapters (EFA, Mellanox/ConnectX) as sysfs infiniband shows them: ports, state and counters."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RdmaPort:
    number: int
    state: str | None  # "ACTIVE", "DOWN", "INIT", ... (text after "N: " in sysfs)
    phys_state: str | None  # "LinkUp", "Disabled", ...
    rate: str | None  # "100 Gb/sec (4X EDR)"
    link_layer: str | None  # "InfiniBand", "Ethernet", "Unspecified" (EFA)
    counters: dict[str, int] = field(default_factory=dict)  # hw_counters + counters


@dataclass(frozen=True)
class RdmaDevice:
    name: str  # "rdmap79s0", "mlx5_0", "efa_0"
    pci: str | None  # normalised PCI id of the backing function, None if unknown
    vendor: str | None  # "0x1d0f" (Amazon EFA), "0x15b3" (Mellanox)
    driver: str | None  # "efa", "mlx5_core"
    ports: tuple[RdmaPort, ...]

    @property
    def is_efa(self) -> bool:
        return (self.vendor or "").lower() == "0x1d0f" or (self.driver or "") == "efa"


@dataclass(frozen=True)
class RdmaSample:
    """One read of every RDMA device, with the monotonic time it was taken (for counter rates)."""

    devices: tuple[RdmaDevice, ...]
    taken_at: float  # seconds, monotonic or epoch: only differences are used
