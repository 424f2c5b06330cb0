"""NVIDIA's DRA driver as the API server sees it, for tests and bench/: which Kubernetes version
serves DeviceTaintRules with which flags, and a ResourceSlice shaped as cmd/gpu-kubelet-plugin
publishes the 8 GPUs of the p5.48xlarge snapshot (examples/snapshots/p5.48xlarge-healthy).

The table (k8s.io/kubernetes pkg/features/kube_features.go and pkg/registry/resource/rest of each
release): the API server serves a DeviceTaintRule version whenever that API version is enabled (its
feature gate does not stop it serving); the gates matter to the scheduler and to
kube-controller-manager's device-taint-eviction controller.
- 1.34: v1alpha3 only, with DRADeviceTaints (alpha) and --runtime-config; no None effect, no status.
- 1.35: v1alpha3 only (DRADeviceTaintRules alpha): stock serves none. Not enabled by the tests: an
  alpha API, and the issue's 1.35 proof is the stock fallback (the node taint and the Event).
- 1.36: v1beta2 with DRADeviceTaintRules (beta, off) and --runtime-config=resource.k8s.io/v1beta2=true.
- 1.37: v1, GA, served and on by default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DRIVER = "gpu.nvidia.com"


@dataclass(frozen=True)
class DeviceTaintSupport:
    """What one minor release needs for per-GPU isolation."""

    version: str | None  # the DeviceTaintRule version served with `apiserver` (None: the tests serve none)
    apiserver: tuple[str, ...] = ()  # kube-apiserver flags that serve it
    controller_manager: tuple[str, ...] = ()  # kube-controller-manager flags for its eviction controller
    stock: str | None = None  # the version a stock server serves
    none_served: tuple[str, ...] = ()  # kube-apiserver flags under which no version is served


SUPPORT: dict[int, DeviceTaintSupport] = {
    34: DeviceTaintSupport(
        "v1alpha3",
        (
            "--feature-gates=DynamicResourceAllocation=true,DRADeviceTaints=true",
            "--runtime-config=resource.k8s.io/v1alpha3=true",
        ),
        ("--feature-gates=DynamicResourceAllocation=true,DRADeviceTaints=true",),
    ),
    35: DeviceTaintSupport(None),
    36: DeviceTaintSupport(
        "v1beta2",
        ("--feature-gates=DRADeviceTaintRules=true", "--runtime-config=resource.k8s.io/v1beta2=true"),
        ("--feature-gates=DRADeviceTaintRules=true",),
    ),
    37: DeviceTaintSupport(
        "v1", stock="v1", none_served=("--runtime-config=resource.k8s.io/v1/devicetaintrules=false",)
    ),
}


def minor_of(version: str) -> int:
    """`v1.37.2` → 37."""
    return int(version.lstrip("v").split(".")[1])


def support(version: str) -> DeviceTaintSupport:
    """The row of *version* (a minor newer than the table's: the newest row)."""
    return SUPPORT[min(minor_of(version), max(SUPPORT))]


def rules_path(version: str) -> str:
    return f"/apis/resource.k8s.io/{version}/devicetaintrules"


def _pinned() -> str:
    from .binaries import pinned_k8s_version

    return pinned_k8s_version()


# The flags that serve DeviceTaintRules on the pinned release (bench/ and older tests).
APISERVER_ARGS = list(support(_pinned()).apiserver)
GATES = ",".join(
    a.split("=", 1)[1] for a in support(_pinned()).controller_manager if a.startswith("--feature-gates=")
)
# (minor, PCI address, UUID) of the snapshot's 8 GPUs (examples/snapshots/p5.48xlarge-healthy)
GPUS = [
    (0, "0000:53:00.0", "GPU-566e6f65-c38e-b12f-4824-6944218668b9"),
    (1, "0000:64:00.0", "GPU-9930d717-21dd-7692-054e-3d0a2bae76b5"),
    (2, "0000:75:00.0", "GPU-973565ff-45cf-12ea-4e91-33386720f7bb"),
    (3, "0000:86:00.0", "GPU-6b932a61-abfd-5ea1-b26a-7dea7f2fa601"),
    (4, "0000:97:00.0", "GPU-726d356b-f548-bbfd-c81e-b9c68f2f1587"),
    (5, "0000:a8:00.0", "GPU-06db64f6-6181-5a90-cf95-5ce52a58c4e5"),
    (6, "0000:b9:00.0", "GPU-a5271aa6-4cdb-28c7-0ef5-5da271d0caae"),
    (7, "0000:ca:00.0", "GPU-7e78e6c8-c71c-66c7-9ded-f8836cecab32"),
]


def resource_slice(node: str, taints: Mapping[int, list[dict[str, str]]] | None = None) -> dict[str, Any]:
    """One slice as cmd/gpu-kubelet-plugin publishes full GPUs (deviceinfo.go GpuInfo.Attributes).
    *taints*: GPU minor → its device's `taints`, as the driver's NVML health monitor writes them
    (device_health.go healthEventToTaint: {"key": "gpu.nvidia.com/xid", "value": "48", "effect":
    "NoSchedule"}; gpu-lost and unmonitored without value)."""
    devices = [
        {
            "name": f"gpu-{minor}",
            "attributes": {
                "type": {"string": "gpu"},
                "uuid": {"string": uuid},
                "productName": {"string": "NVIDIA H100 80GB HBM3"},
                "resource.kubernetes.io/pciBusID": {"string": pci},
                "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{pci[5:7]}"},
            },
            "capacity": {"memory": {"value": "80Gi"}},
            **({"taints": (taints or {})[minor]} if minor in (taints or {}) else {}),
        }
        for minor, pci, uuid in GPUS
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}-slice"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def apiserver_version(binaries: Any) -> str:
    """The version of *binaries*' kube-apiserver (`v1.37.2`), asked before any server starts: its
    flags depend on it."""
    import subprocess

    out = subprocess.run(
        [str(binaries.kube_apiserver), "--version"], capture_output=True, text=True, check=False
    ).stdout.split()
    return out[-1] if out and out[-1].startswith("v") else _pinned()
