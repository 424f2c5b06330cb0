"""A fake kubelet PodResources endpoint: a real gRPC server on a unix socket whose messages are
compiled (grpc_tools' protoc) from the kubelet's published api.proto in tests/fixtures/kubelet/, so
the agent's own descriptors (agent/probes/pod_resources.py) meet the real wire format."""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

PROTO = Path(__file__).parent / "fixtures" / "kubelet" / "podresources-v1-api.proto"


def compile_api(out: Path) -> tuple[Any, Any]:
    """(messages, service) modules of the published API, compiled into *out*."""
    from grpc_tools import protoc

    stem = "fake_kubelet_podresources_v1"  # a module name of its own; the file is copied unchanged
    if f"{stem}_pb2" in sys.modules:
        return sys.modules[f"{stem}_pb2"], sys.modules[f"{stem}_pb2_grpc"]
    (out / f"{stem}.proto").write_bytes(PROTO.read_bytes())
    rc = protoc.main(
        ["protoc", f"-I{out}", f"--python_out={out}", f"--grpc_python_out={out}", f"{stem}.proto"]
    )
    assert rc == 0
    sys.path.insert(0, str(out))
    try:
        return importlib.import_module(f"{stem}_pb2"), importlib.import_module(f"{stem}_pb2_grpc")
    finally:
        sys.path.remove(str(out))


@contextmanager
def serve(api: tuple[Any, Any], sock: Path, response: Any) -> Iterator[dict[str, Any]]:
    """A kubelet at *sock* answering List with `state["response"]` (or aborting with
    `state["status"]`, after `state["delay"]` seconds)."""
    _, pb2_grpc = api
    state: dict[str, Any] = {"response": response, "status": None, "delay": 0.0, "calls": 0}

    class Lister(pb2_grpc.PodResourcesListerServicer):  # type: ignore[misc,name-defined]
        def List(self, request: Any, context: Any) -> Any:  # the API's method name
            state["calls"] += 1
            time.sleep(state["delay"])
            if state["status"] is not None:
                context.abort(state["status"], "kubelet says no")
            return state["response"]

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb2_grpc.add_PodResourcesListerServicer_to_server(Lister(), server)
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    state["socket"] = str(sock)
    try:
        yield state
    finally:
        server.stop(None)


def pod(pb2: Any, ns: str, name: str, container: str, resource: str, *ids: str) -> Any:
    """One pod with one container holding *ids* of *resource*."""
    dev = pb2.ContainerDevices(resource_name=resource, device_ids=list(ids))
    return pb2.PodResources(
        namespace=ns, name=name, containers=[pb2.ContainerResources(name=container, devices=[dev])]
    )
