"""Which workloads hold which GPUs, as the kubelet's PodResources API reports them.

The kubelet knows exactly which device IDs it handed to which container — device-plugin resources
(`nvidia.com/gpu`, MIG resources such as `nvidia.com/mig-1g.10gb`) and devices allocated through
Dynamic Resource Allocation (DRA) — so the agent asks it instead of reading Pod specs cluster-wide.
This module maps those IDs onto the node's GPUs; pure, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

NVIDIA_RESOURCE = re.compile(r"^nvidia\.com/(gpu|mig-.+)$")
NVIDIA_DRA_DRIVER = "gpu.nvidia.com"
GPU_UUID = re.compile(r"GPU-[0-9a-fA-F-]{36}")
MIG_UUID = re.compile(r"MIG-[0-9a-fA-F-]{36}")
DRA_DEVICE = re.compile(r"^gpu-(\d+)(?:-mig-.*)?$")  # the NVIDIA DRA driver's device names
INDEX_ID = re.compile(r"^(\d+)(?::\d+)?$")  # deviceIDStrategy=index: "3", MIG "3:1"


@dataclass(frozen=True)
class DraDevice:
    """One device of a DRA claim allocated to a container."""

    driver: str
    pool: str
    device: str
    cdi_devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class ContainerDevices:
    """What one container holds: device-plugin resources (name -> device IDs) and DRA devices."""

    namespace: str
    pod: str
    container: str
    resources: tuple[tuple[str, tuple[str, ...]], ...] = ()
    dra: tuple[DraDevice, ...] = ()

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.pod}/{self.container}"

    def holds_gpus(self) -> bool:
        """Any NVIDIA device at all: a GPU, a MIG slice or an NVIDIA DRA device."""
        return any(NVIDIA_RESOURCE.match(name) and ids for name, ids in self.resources) or any(
            d.driver == NVIDIA_DRA_DRIVER for d in self.dra
        )


@dataclass(frozen=True)
class GpuIdentity:
    """How a GPU can be named in a device ID: index, UUID, and the UUIDs of its MIG devices."""

    index: int
    uuid: str | None = None
    mig_uuids: tuple[str, ...] = ()


def _gpu_of_id(device_id: str, gpus: Iterable[GpuIdentity]) -> int | None:
    """The GPU index a device-plugin ID or DRA/CDI name refers to, None if it names none of them."""
    gpus = tuple(gpus)
    m = GPU_UUID.search(device_id)
    if m:
        uuid = m.group(0).lower()
        return next((g.index for g in gpus if g.uuid and g.uuid.lower() == uuid), None)
    m = MIG_UUID.search(device_id)
    if m:
        mig = m.group(0).lower()
        return next((g.index for g in gpus if mig in (u.lower() for u in g.mig_uuids)), None)
    m = INDEX_ID.match(device_id)
    if m:
        index = int(m.group(1))
        return index if any(g.index == index for g in gpus) else None
    return None


def gpu_holders(
    containers: Iterable[ContainerDevices], gpus: Iterable[GpuIdentity]
) -> tuple[dict[int, tuple[str, ...]], tuple[str, ...]]:
    """Pure: GPU index -> the containers (namespace/pod/container) holding it, and the containers
    that hold NVIDIA devices we could not map to a GPU (a MIG UUID the inventory does not list, an
    ID in a form we do not know): those hit *some* GPU of this node, and are named as such."""
    gpus = tuple(gpus)
    by_gpu: dict[int, set[str]] = {}
    unmapped: set[str] = set()
    for c in containers:
        found: list[int | None] = [
            _gpu_of_id(i, gpus) for name, ids in c.resources if NVIDIA_RESOURCE.match(name) for i in ids
        ]
        found += [_dra_gpu(d, gpus) for d in c.dra if d.driver == NVIDIA_DRA_DRIVER]
        for index in found:
            if index is None:
                unmapped.add(c.ref)
            else:
                by_gpu.setdefault(index, set()).add(c.ref)
    return {i: tuple(sorted(refs)) for i, refs in sorted(by_gpu.items())}, tuple(sorted(unmapped))


def _dra_gpu(device: DraDevice, gpus: tuple[GpuIdentity, ...]) -> int | None:
    """A DRA device's GPU: by a UUID in its CDI device names when there is one (unambiguous), else
    by the NVIDIA DRA driver's device name `gpu-<index>` (`gpu-<index>-mig-…` for a MIG slice)."""
    for name in device.cdi_devices:
        if GPU_UUID.search(name) or MIG_UUID.search(name):
            return _gpu_of_id(name, gpus)
    m = DRA_DEVICE.match(device.device)
    return _gpu_of_id(m.group(1), gpus) if m else None


def pods_holding_gpus(containers: Iterable[ContainerDevices]) -> list[str]:
    """Pure: namespace/name of every pod with a container that holds an NVIDIA device."""
    return sorted({f"{c.namespace}/{c.pod}" for c in containers if c.holds_gpus()})
