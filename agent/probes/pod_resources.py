"""The kubelet's PodResources API (gRPC `v1.PodResourcesLister/List` on a unix socket): which
container holds which device, device plugins and DRA alike.

It replaces a cluster-wide `pods list`: the kubelet answers for this node only, knows MIG and DRA
allocations that Pod specs do not show, and needs no API right. The messages are the published
API's (k8s.io/kubelet/pkg/apis/podresources/v1/api.proto; names and field numbers are facts of the
API), described here for the fields we read; protobuf skips the others. grpc and protobuf are
imported on first use only, so an agent that never asks does not carry them.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any

from agent.core.probed import ProbeError, ProbeErrorKind
from agent.core.workloads import ContainerDevices, DraDevice

log = logging.getLogger(__name__)

SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
METHOD = "/v1.PodResourcesLister/List"
MAX_MESSAGE = 16 * 1024 * 1024  # a node with many pods; the kubelet's own limit is the same order
WHAT = "kubelet PodResources"

_STRING, _MESSAGE = 9, 11  # FieldDescriptorProto.Type
_OPTIONAL, _REPEATED = 1, 3  # FieldDescriptorProto.Label

# message -> (field, number, type, label, message type) for what the agent reads
_MESSAGES: dict[str, tuple[tuple[str, int, int, int, str], ...]] = {
    "ListPodResourcesRequest": (),
    "ListPodResourcesResponse": (("pod_resources", 1, _MESSAGE, _REPEATED, "PodResources"),),
    "PodResources": (
        ("name", 1, _STRING, _OPTIONAL, ""),
        ("namespace", 2, _STRING, _OPTIONAL, ""),
        ("containers", 3, _MESSAGE, _REPEATED, "ContainerResources"),
    ),
    "ContainerResources": (
        ("name", 1, _STRING, _OPTIONAL, ""),
        ("devices", 2, _MESSAGE, _REPEATED, "ContainerDevices"),
        ("dynamic_resources", 5, _MESSAGE, _REPEATED, "DynamicResource"),
    ),
    "ContainerDevices": (
        ("resource_name", 1, _STRING, _OPTIONAL, ""),
        ("device_ids", 2, _STRING, _REPEATED, ""),
    ),
    "DynamicResource": (
        ("claim_name", 2, _STRING, _OPTIONAL, ""),
        ("claim_namespace", 3, _STRING, _OPTIONAL, ""),
        ("claim_resources", 4, _MESSAGE, _REPEATED, "ClaimResource"),
    ),
    "ClaimResource": (
        ("cdi_devices", 1, _MESSAGE, _REPEATED, "CDIDevice"),
        ("driver_name", 2, _STRING, _OPTIONAL, ""),
        ("pool_name", 3, _STRING, _OPTIONAL, ""),
        ("device_name", 4, _STRING, _OPTIONAL, ""),
    ),
    "CDIDevice": (("name", 1, _STRING, _OPTIONAL, ""),),
}


@functools.cache
def messages() -> dict[str, Any]:
    """The message classes, built once from the descriptors above in a pool of their own."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fdp = descriptor_pb2.FileDescriptorProto(
        name="gpu_healthcheck/kubelet_podresources_v1.proto", package="v1", syntax="proto3"
    )
    for name, fields in _MESSAGES.items():
        msg = fdp.message_type.add(name=name)
        for field, number, typ, label, type_name in fields:
            f = msg.field.add(name=field, number=number, type=typ, label=label)
            if type_name:
                f.type_name = f".v1.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1.{n}")) for n in _MESSAGES}


def decode(payload: bytes) -> tuple[ContainerDevices, ...]:
    """A serialized ListPodResourcesResponse as our types (ValueError when it is not one)."""
    try:
        resp = messages()["ListPodResourcesResponse"].FromString(payload)
    except Exception as exc:  # google.protobuf.message.DecodeError
        raise ValueError(f"not a ListPodResourcesResponse: {exc}") from exc
    out = []
    for pod in resp.pod_resources:
        for c in pod.containers:
            resources = tuple((d.resource_name, tuple(d.device_ids)) for d in c.devices)
            dra = tuple(
                DraDevice(r.driver_name, r.pool_name, r.device_name, tuple(x.name for x in r.cdi_devices))
                for claim in c.dynamic_resources
                for r in claim.claim_resources
            )
            if resources or dra:
                out.append(ContainerDevices(pod.namespace, pod.name, c.name, resources, dra))
    return tuple(out)


def list_devices(socket: str = SOCKET, timeout_s: float = 5.0) -> tuple[ContainerDevices, ...] | ProbeError:
    """Every container on this node that holds a device, or why we could not ask."""
    if not os.path.exists(socket):
        return ProbeError(
            WHAT, ProbeErrorKind.UNAVAILABLE, f"no socket at {socket} (mount /var/lib/kubelet/pod-resources)"
        )
    import grpc

    try:
        with grpc.insecure_channel(
            f"unix://{socket}", options=[("grpc.max_receive_message_length", MAX_MESSAGE)]
        ) as channel:
            call = channel.unary_unary(
                METHOD,
                request_serializer=lambda _: b"",  # ListPodResourcesRequest has no fields
                response_deserializer=lambda raw: raw,
            )
            payload = call(None, timeout=timeout_s)
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else None
        kind = (
            ProbeErrorKind.TIMEOUT
            if code == grpc.StatusCode.DEADLINE_EXCEEDED
            else ProbeErrorKind.UNAVAILABLE
        )
        details = exc.details() if hasattr(exc, "details") else str(exc)
        return ProbeError(WHAT, kind, f"{code}: {details}")
    try:
        return decode(payload)
    except ValueError as exc:
        return ProbeError(WHAT, ProbeErrorKind.UNREADABLE, str(exc))


def gpu_pods(socket: str = SOCKET, timeout_s: float = 5.0) -> Callable[[], list[str]]:
    """For the DCGM diag's idle gate: the pods on this node holding an NVIDIA device (a GPU, a MIG
    slice, a DRA device). Raises when the kubelet cannot be asked, so the gate never calls busy
    GPUs idle; a missing socket is logged once (by the caller's error), not on every ask."""
    from agent.core.workloads import pods_holding_gpus

    said: list[str] = []

    def pods() -> list[str]:
        got = list_devices(socket, timeout_s)
        if isinstance(got, ProbeError):
            if str(got) not in said:  # once per distinct problem, not on every ask
                said[:] = [str(got)]
                log.warning("cannot tell which pods hold GPUs: %s", got)
            raise RuntimeError(str(got))
        if said:
            said.clear()
            log.info("%s answers again", WHAT)
        return pods_holding_gpus(got)

    return pods
