"""The GPUs NVIDIA's DRA driver publishes for this node: what the scheduler can allocate on a node
without a device plugin (the GPU Operator's DRA-only mode: no `nvidia.com/gpu` on the Node).

The driver (kubernetes-sigs/dra-driver-nvidia-gpu, cmd/gpu-kubelet-plugin) writes ResourceSlices of
driver `gpu.nvidia.com`, pool = the node's name, one device per thing it can allocate: a whole GPU
`gpu-<minor>` (attribute `type` = `gpu`), a MIG device `gpu-<minor>-mig-<profile>-<id>-<start>`
(`mig`; `migdyn` with DynamicMIG: abstract, no `uuid`), a passthrough GPU `gpu-vfio-<n>` (`vfio`).
Each carries the standard attribute `resource.kubernetes.io/pciBusID` of its physical GPU (a MIG
device its parent's, and `parentUUID`). With DynamicMIG on Kubernetes 1.35+ a pool is G+1 slices:
one of shared counters only, one per GPU. A physical GPU is published when any device names it,
by PCI address, else by UUID; a pool whose newest generation is not all there is being republished
and says nothing yet (the scheduler too ignores older generations).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.core.metric_labels import DriverTaintEffect, DriverTaintKey
from agent.core.pci import normalize_pci, short_pci

WHOLE, MIG, MIG_DYNAMIC, VFIO = "gpu", "mig", "migdyn", "vfio"  # the driver's `type` attribute
WHOLE_NAME = re.compile(r"gpu-\d+$")  # a whole GPU's device name, where a device has no `type`


@dataclass(frozen=True)
class DeviceTaint:
    """One taint the driver put on its own device (`spec.devices[].taints`): its health monitor's
    verdict on that GPU (checks/dra_taints.py says what it writes)."""

    key: str
    value: str = ""
    effect: str = ""

    @property
    def text(self) -> str:
        """`gpu.nvidia.com/xid=48:NoSchedule`, `gpu.nvidia.com/gpu-lost:NoSchedule` (no value), as
        `kubectl` writes a taint."""
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


@dataclass(frozen=True)
class DraDevice:
    """One device of this node's gpu.nvidia.com ResourceSlices."""

    name: str
    pool: str
    type: str = ""  # the driver's `type` attribute; "" where absent
    pci: str = ""  # normalised PCI address of its physical GPU; "" where absent
    uuid: str = ""  # its own (a MIG device's is MIG-…)
    parent_uuid: str = ""  # a MIG device's physical GPU
    product: str = ""
    taints: tuple[DeviceTaint, ...] = ()  # the driver's own device taints

    @property
    def gpu_uuid(self) -> str:
        """The physical GPU's UUID as this device names it (a passthrough device's is not one)."""
        return self.parent_uuid or self.uuid

    @property
    def whole(self) -> bool:
        return self.type == WHOLE or (not self.type and bool(WHOLE_NAME.match(self.name)))


@dataclass(frozen=True)
class PublishedGpu:
    """One physical GPU as the driver publishes it: every device that names it."""

    pci: str  # normalised; "" when no device of it names one
    uuid: str
    devices: tuple[DraDevice, ...]

    @property
    def device(self) -> str:
        """The device that stands for the whole GPU (`gpu-3`; a passthrough `gpu-vfio-3`); "" for a
        GPU published only as MIG devices."""
        whole = sorted(d.name for d in self.devices if d.whole)
        vfio = sorted(d.name for d in self.devices if d.type == VFIO)
        return (whole or vfio or [""])[0]

    @property
    def partitions(self) -> int:
        return sum(d.type in (MIG, MIG_DYNAMIC) for d in self.devices)

    @property
    def passthrough_only(self) -> bool:
        """Bound to vfio-pci for a VM: NVML does not see such a GPU, and that is no fault."""
        return all(d.type == VFIO for d in self.devices)

    @property
    def taints(self) -> tuple[tuple[str, DeviceTaint], ...]:
        """The driver's taints on this GPU's devices, (device, taint), once each, in order."""
        return tuple(dict.fromkeys((d.name, t) for d in self.devices for t in d.taints))

    def taint_texts(self) -> list[str]:
        """Its taints as the per-GPU verdict lists them: `gpu.nvidia.com/xid=48:NoSchedule` where the
        whole GPU's device (or every device of it) has it, else with the MIG device that has it
        (`… on gpu-0-mig-1g.10gb-19-0`)."""
        on: dict[DeviceTaint, list[str]] = {}
        for name, t in self.taints:
            on.setdefault(t, []).append(name)
        everywhere = {d.name for d in self.devices}
        out: set[str] = set()
        for t, names in on.items():
            if self.device in names or set(names) == everywhere:
                out.add(t.text)
            else:
                out.update(f"{t.text} on {n}" for n in names)
        return sorted(out)

    @property
    def label(self) -> str:
        name = self.device or min(d.name for d in self.devices)
        where = short_pci(self.pci) if self.pci else self.uuid
        return f"{name} ({where})" if where else name


@dataclass(frozen=True)
class DraSlices:
    """This node's gpu.nvidia.com ResourceSlices as the checks read them."""

    node: str
    devices: tuple[DraDevice, ...] = ()
    slices: int = 0  # the slices of the pools' newest generations
    incomplete: str = ""  # why a pool's newest generation is not all there ("": every slice listed)

    def gpus(self) -> tuple[PublishedGpu, ...]:
        """The physical GPUs published, by PCI address, else by UUID, in PCI order."""
        groups: dict[str, list[DraDevice]] = {}
        uuid_key: dict[str, str] = {}
        for d in self.devices:  # PCI-addressed first, so that a UUID-only device joins its GPU
            if d.pci:
                groups.setdefault(d.pci, []).append(d)
                if d.gpu_uuid:
                    uuid_key.setdefault(d.gpu_uuid, d.pci)
        for d in self.devices:
            if not d.pci:
                key = uuid_key.get(d.gpu_uuid) or f"uuid:{d.gpu_uuid or d.name}"
                groups.setdefault(key, []).append(d)
        out = []
        for key, devs in sorted(groups.items()):
            pci = "" if key.startswith("uuid:") else key
            # a passthrough device's `uuid` is the driver's own (a hash of the PCI address)
            uuid = next((d.gpu_uuid for d in devs if d.gpu_uuid and d.type != VFIO), "")
            out.append(PublishedGpu(pci, uuid, tuple(devs)))
        return tuple(out)

    def taint_series(self) -> list[tuple[str, DriverTaintKey, DriverTaintEffect]]:
        """(GPU, key, effect) of each of the driver's taints, once each, for the metric
        gpu_healthcheck_driver_device_taints: the GPU by its whole device (`gpu-2`), else its PCI
        address; keys and effects in their closed sets (core/metric_labels.py)."""
        out: dict[tuple[str, DriverTaintKey, DriverTaintEffect], None] = {}
        for p in self.gpus():
            gpu = p.device or (short_pci(p.pci) if p.pci else p.label)
            for _, t in p.taints:
                out[(gpu, DriverTaintKey.of(t.key), DriverTaintEffect.of(t.effect))] = None
        return sorted(out)

    def published(self, pci: str | None, uuid: str | None) -> PublishedGpu | None:
        """The published GPU at this PCI address, else with this UUID; None when the driver does
        not publish it."""
        gpus = self.gpus()
        if pci:
            norm = normalize_pci(pci)
            hit = next((g for g in gpus if g.pci == norm), None)
            if hit is not None:
                return hit
        if uuid:
            return next((g for g in gpus if g.uuid == uuid), None)
        return None


__all__ = ["MIG", "MIG_DYNAMIC", "VFIO", "WHOLE", "DeviceTaint", "DraDevice", "DraSlices", "PublishedGpu"]
