"""Which pods hold which GPUs, asked of a fake kubelet at its socket.

The fake kubelet is a real gRPC server on a unix socket whose messages are compiled (grpc_tools'
protoc) from the kubelet's published api.proto (tests/fixtures/kubelet/), and it fills fields the
agent does not read (CPU IDs, memory, NUMA topology, DRA share IDs): the agent's own descriptors
are tested against the real wire format."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.core.probed import ProbeError, ProbeErrorKind
from agent.core.workloads import ContainerDevices, DraDevice, GpuIdentity, gpu_holders, pods_holding_gpus
from agent.probes.pod_resources import gpu_pods, list_devices
from tests.fake_kubelet import compile_api, serve

UUID = [f"GPU-{i:08x}-99e6-cc74-af59-87a49bc07d7f" for i in range(8)]
MIG = "MIG-0a1b2c3d-1111-2222-3333-444455556666"
MIG_UNKNOWN = "MIG-ffffffff-1111-2222-3333-444455556666"
GPUS = tuple(GpuIdentity(i, UUID[i], (MIG,) if i == 6 else ()) for i in range(8))


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The published API compiled by protoc: the fake kubelet's message and service classes."""
    return compile_api(tmp_path_factory.mktemp("podresources"))


def _response(pb2: Any) -> Any:
    """A node as a kubelet reports it: GPUs by UUID, time-sliced, by index, MIG by UUID and by
    index, DRA with and without CDI names, EFA (not ours), a pod with no devices."""
    numa = pb2.TopologyInfo(nodes=[pb2.NUMANode(ID=0)])

    def dev(name: str, *ids: str) -> Any:
        return pb2.ContainerDevices(resource_name=name, device_ids=list(ids), topology=numa)

    def dra(device: str, *cdi: str) -> Any:
        res = pb2.ClaimResource(
            driver_name="gpu.nvidia.com",
            pool_name="node-a",
            device_name=device,
            cdi_devices=[pb2.CDIDevice(name=c) for c in cdi],
            share_id="s1",
        )
        return pb2.DynamicResource(claim_name="c", claim_namespace="ml", claim_resources=[res])

    def pod(ns: str, name: str, *containers: Any) -> Any:
        return pb2.PodResources(namespace=ns, name=name, containers=list(containers), cpu_ids=[1, 2])

    def ctr(name: str, devices: list[Any] = (), dyn: list[Any] = ()) -> Any:  # type: ignore[assignment]
        return pb2.ContainerResources(
            name=name,
            devices=list(devices),
            dynamic_resources=list(dyn),
            cpu_ids=[3],
            memory=[pb2.ContainerMemory(memory_type="memory", size=1 << 30, topology=numa)],
        )

    return pb2.ListPodResourcesResponse(
        pod_resources=[
            pod("ml", "train-0", ctr("main", [dev("nvidia.com/gpu", UUID[0], UUID[1])])),
            pod("ml", "shared", ctr("a", [dev("nvidia.com/gpu", f"{UUID[2]}::3")])),  # time-slicing
            pod("ml", "by-index", ctr("main", [dev("nvidia.com/gpu", "3")])),
            pod("ml", "mig", ctr("main", [dev("nvidia.com/mig-1g.10gb", MIG)])),
            pod("ml", "mig-index", ctr("main", [dev("nvidia.com/mig-1g.10gb", "7:1")])),
            pod("ml", "mig-unknown", ctr("main", [dev("nvidia.com/mig-1g.10gb", MIG_UNKNOWN)])),
            pod("ml", "dra-cdi", ctr("main", dyn=[dra("gpu-0", f"k8s.gpu.nvidia.com/device={UUID[4]}")])),
            pod("ml", "dra-name", ctr("main", dyn=[dra("gpu-5")])),
            pod("net", "efa-only", ctr("main", [dev("vpc.amazonaws.com/efa", "0", "1")])),
            pod("kube-system", "no-devices", ctr("main")),
        ]
    )


@pytest.fixture
def kubelet(api: Any, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A fake kubelet at tmp/kubelet.sock answering List with `state["response"]` (or a status)."""
    with serve(api, tmp_path / "kubelet.sock", _response(api[0])) as state:
        yield state


def test_every_way_a_container_holds_a_gpu_is_mapped_to_it(kubelet: dict[str, Any]) -> None:
    got = list_devices(kubelet["socket"])
    assert not isinstance(got, ProbeError), got
    by_gpu, unmapped = gpu_holders(got, GPUS)
    assert by_gpu == {
        0: ("ml/train-0/main",),  # dra-cdi's device is named gpu-0, but its CDI name's UUID is GPU 4's
        1: ("ml/train-0/main",),
        2: ("ml/shared/a",),  # time-slicing: UUID::replica
        3: ("ml/by-index/main",),  # deviceIDStrategy=index
        4: ("ml/dra-cdi/main",),
        5: ("ml/dra-name/main",),  # DRA without CDI names: the driver's device name gpu-<index>
        6: ("ml/mig/main",),  # a MIG UUID the inventory lists under GPU 6
        7: ("ml/mig-index/main",),  # MIG with deviceIDStrategy=index: "<gpu>:<mig>"
    }
    assert unmapped == ("ml/mig-unknown/main",)  # an NVIDIA device, but which GPU is unknown
    assert pods_holding_gpus(got) == [
        "ml/by-index", "ml/dra-cdi", "ml/dra-name", "ml/mig", "ml/mig-index", "ml/mig-unknown",
        "ml/shared", "ml/train-0",
    ]  # fmt: skip


def test_the_idle_gate_sees_gpu_pods_and_a_node_without_them(kubelet: dict[str, Any], api: Any) -> None:
    pb2, _ = api
    ask = gpu_pods(kubelet["socket"])
    assert "ml/train-0" in ask() and "net/efa-only" not in ask()
    kubelet["response"] = pb2.ListPodResourcesResponse(
        pod_resources=[pb2.PodResources(namespace="net", name="efa-only")]
    )
    assert ask() == []


def test_no_socket_is_unavailable_and_said_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    missing = str(tmp_path / "nope.sock")
    got = list_devices(missing)
    assert isinstance(got, ProbeError) and got.kind is ProbeErrorKind.UNAVAILABLE
    assert "mount /var/lib/kubelet/pod-resources" in got.message
    ask = gpu_pods(missing)
    with caplog.at_level(logging.WARNING, logger="agent.probes.pod_resources"):
        for _ in range(3):
            with pytest.raises(RuntimeError):  # never "no GPU pods" when we could not ask
                ask()
    assert sum("cannot tell which pods hold GPUs" in r.message for r in caplog.records) == 1


def test_a_kubelet_error_or_a_hang_is_a_probe_error(kubelet: dict[str, Any]) -> None:
    kubelet["status"] = grpc.StatusCode.UNAVAILABLE
    got = list_devices(kubelet["socket"])
    assert isinstance(got, ProbeError) and got.kind is ProbeErrorKind.UNAVAILABLE
    assert "kubelet says no" in got.message
    kubelet["status"], kubelet["delay"] = None, 1.0
    got = list_devices(kubelet["socket"], timeout_s=0.2)
    assert isinstance(got, ProbeError) and got.kind is ProbeErrorKind.TIMEOUT


def test_grpc_is_not_imported_until_asked() -> None:
    code = (
        "import sys, agent.probes.pod_resources, agent.core.workloads;"
        "print('grpc' in sys.modules, 'google.protobuf' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_mapping_is_pure_and_ignores_other_vendors() -> None:
    efa = ContainerDevices("net", "p", "c", (("vpc.amazonaws.com/efa", ("0",)),))
    other_dra = ContainerDevices("x", "p", "c", dra=(DraDevice("nic.example.com", "pool", "gpu-0"),))
    assert gpu_holders([efa, other_dra], GPUS) == ({}, ())
    assert pods_holding_gpus([efa, other_dra]) == []


def test_a_dra_only_node_is_busy_while_a_pod_holds_a_claim_device(kubelet: dict[str, Any], api: Any) -> None:
    """GPU Operator's DRA-only mode: no device plugin, no nvidia.com/gpu anywhere; a pod holding a
    device of NVIDIA's DRA driver keeps the diag off, a pod holding another driver's device does not."""
    from agent.probes.dcgm.idle import IdleGate

    pb2, _ = api

    def claim(driver: str, device: str) -> Any:
        res = pb2.ClaimResource(driver_name=driver, pool_name="node-a", device_name=device)
        return pb2.DynamicResource(claim_name="c", claim_namespace="ml", claim_resources=[res])

    def only(driver: str, device: str) -> Any:
        ctr = pb2.ContainerResources(name="main", dynamic_resources=[claim(driver, device)])
        return pb2.ListPodResourcesResponse(
            pod_resources=[pb2.PodResources(namespace="ml", name="dra-train", containers=[ctr])]
        )

    gate = IdleGate(compute_processes=lambda: {}, pods_requesting_gpus=gpu_pods(kubelet["socket"]))
    kubelet["response"] = only("gpu.nvidia.com", "gpu-3")
    verdict = gate.check()
    assert not verdict.idle and "ml/dra-train" in verdict.reason and "NVIDIA devices" in verdict.reason
    kubelet["response"] = only("nic.example.com", "eth-0")
    assert gate.check().idle
