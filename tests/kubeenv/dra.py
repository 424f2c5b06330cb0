"""NVIDIA's DRA driver as the API server sees it, for tests and bench/: the gates that serve
DeviceTaintRules, and a ResourceSlice shaped as cmd/gpu-kubelet-plugin publishes the 8 GPUs of the
p5.48xlarge snapshot (examples/snapshots/p5.48xlarge-healthy)."""

from __future__ import annotations

from typing import Any

DRIVER = "gpu.nvidia.com"
GATES = "DynamicResourceAllocation=true,DRADeviceTaints=true"
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
APISERVER_ARGS = [f"--feature-gates={GATES}", "--runtime-config=resource.k8s.io/v1alpha3=true"]


def resource_slice(node: str) -> dict[str, Any]:
    """One slice as cmd/gpu-kubelet-plugin publishes full GPUs (deviceinfo.go GpuInfo.Attributes)."""
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
