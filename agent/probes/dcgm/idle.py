"""Idle gating for the DCGM diag: it stresses every GPU for minutes, so it runs only on idle GPUs.

Idle = no compute process on any GPU (NVML nvmlDeviceGetComputeRunningProcesses) and no pod on this node
holding an NVIDIA device, as the kubelet's PodResources API reports it (probes/pod_resources.gpu_pods):
a device-plugin GPU (nvidia.com/gpu, time-sliced replicas), a MIG slice (nvidia.com/mig-*), or a DRA
device of NVIDIA's driver (gpu.nvidia.com), which a Pod spec's resource requests never show. An
allocated but momentarily quiet job must not be hit either. When either cannot be read, the node is
treated as busy: never run a diag on a guess.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class IdleVerdict:
    idle: bool
    reason: str


def nvml_compute_processes() -> dict[int, int]:
    """GPU index → number of compute processes, through pynvml (nvidia-ml-py)."""
    import pynvml  # type: ignore[import-not-found,unused-ignore]

    pynvml.nvmlInit()
    try:
        out: dict[int, int] = {}
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            out[i] = len(pynvml.nvmlDeviceGetComputeRunningProcesses(h))
        return out
    finally:
        pynvml.nvmlShutdown()


class IdleGate:
    def __init__(
        self,
        compute_processes: Callable[[], dict[int, int]] | None = nvml_compute_processes,
        pods_requesting_gpus: Callable[[], list[str]] | None = None,
    ) -> None:
        self.compute_processes = compute_processes
        self.pods_requesting_gpus = pods_requesting_gpus

    def check(self) -> IdleVerdict:
        if self.compute_processes is not None:
            try:
                procs = self.compute_processes()
            except Exception as exc:
                return IdleVerdict(False, f"cannot list GPU compute processes: {exc}")
            busy = sorted(g for g, n in procs.items() if n > 0)
            if busy:
                return IdleVerdict(False, f"compute processes on GPU(s) {', '.join(map(str, busy))}")
        if self.pods_requesting_gpus is not None:
            try:
                pods = self.pods_requesting_gpus()
            except Exception as exc:
                return IdleVerdict(False, f"cannot list pods on this node: {exc}")
            if pods:
                shown = ", ".join(pods[:3]) + (f" (+{len(pods) - 3})" if len(pods) > 3 else "")
                return IdleVerdict(False, f"pod(s) holding NVIDIA devices on this node: {shown}")
        return IdleVerdict(True, "GPUs idle")
