"""What the checks need from this agent's own Kubernetes Node object."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class NodeObject:
    """What the checks need from the Node object."""

    name: str
    labels: dict[str, str]
    allocatable_gpus: int | None  # status.allocatable["nvidia.com/gpu"]; None if absent
    capacity_gpus: int | None
    boot_id: str | None = None  # status.nodeInfo.bootID
    annotations: dict[str, str] = field(default_factory=dict)
    taint_keys: tuple[str, ...] = ()  # spec.taints[].key (the validating taint: engine/validation.py)
    created: str | None = None  # metadata.creationTimestamp: a new Node carries its startup taint since

    @property
    def plugin_gpus(self) -> int:
        """The GPUs a device plugin registered (capacity; allocatable where capacity is absent): 0
        on a DRA-only node, whose kubelet may keep the resource at 0 after a plugin left."""
        return max(self.capacity_gpus or 0, self.allocatable_gpus or 0)
