"""KubeEnv: what the ``kube`` fixture yields — a running control plane plus helpers for tests."""

from __future__ import annotations

import functools
import itertools
import json
import os
import re
import secrets
import ssl
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from .binaries import KubeBinaries, pinned_k8s_version
from .server import ControlPlane, write_kubeconfig

__all__ = ["GPU_PRODUCTS", "KubeEnv", "KubectlError", "unique_name"]

# nvidia.com/gpu.product as GPU Feature Discovery labels these instance types.
GPU_PRODUCTS: dict[str, str] = {
    "p5.48xlarge": "NVIDIA-H100-80GB-HBM3",
    "p5e.48xlarge": "NVIDIA-H200",
    "p5en.48xlarge": "NVIDIA-H200",
    "p4d.24xlarge": "NVIDIA-A100-SXM4-40GB",
    "p4de.24xlarge": "NVIDIA-A100-SXM4-80GB",
    "g6e.48xlarge": "NVIDIA-L40S",
}


def unique_name(hint: str = "t", *, max_len: int = 63) -> str:
    """A fresh DNS-1123 label (also a valid label value): sanitised *hint* plus a random suffix."""
    base = re.sub(r"[^a-z0-9-]+", "-", hint.lower()).strip("-") or "t"
    suffix = secrets.token_hex(3)
    base = base[: max_len - len(suffix) - 1].rstrip("-")
    return f"{base}-{suffix}"


def _raw(body: dict[str, Any]) -> Any:
    """The client serialises plain dicts as well as its models."""
    return body


class KubectlError(subprocess.CalledProcessError):
    def __str__(self) -> str:
        return f"{super().__str__()}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"


class KubeEnv:
    """A real etcd + kube-apiserver for tests. Admin is a client certificate in ``system:masters``."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self._kubeconfig_seq = itertools.count(1)

    # -- what tests read -------------------------------------------------------------------------
    @property
    def binaries(self) -> KubeBinaries:
        return self.plane.binaries

    @property
    def url(self) -> str:
        """https://127.0.0.1:PORT of the kube-apiserver."""
        return self.plane.url

    @property
    def ca_cert(self) -> Path:
        return self.plane.ca_cert

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (client certificate, O=system:masters)."""
        return self.plane.admin_kubeconfig

    @property
    def workdir(self) -> Path:
        return self.plane.workdir

    @functools.cached_property
    def version(self) -> str:
        """The kube-apiserver's version, e.g. ``v1.37.2``."""
        out = subprocess.run(
            [str(self.binaries.kube_apiserver), "--version"], capture_output=True, text=True, check=False
        ).stdout.split()
        return out[-1] if out and out[-1].startswith("v") else pinned_k8s_version()

    @property
    def start_seconds(self) -> float:
        return self.plane.start_seconds

    # -- clients --------------------------------------------------------------------------------
    def _configuration(self) -> k8s.Configuration:
        cfg = k8s.Configuration()
        cfg.host = self.url
        cfg.ssl_ca_cert = str(self.ca_cert)
        cfg.verify_ssl = True
        if hasattr(cfg, "no_proxy"):
            cfg.no_proxy = "127.0.0.1,localhost"
        return cfg

    def api_client(self) -> k8s.ApiClient:
        """A new admin ``kubernetes.client.ApiClient`` (close it, or use it as a context manager)."""
        assert self.plane.pki is not None
        cfg = self._configuration()
        cfg.cert_file = str(self.plane.pki.admin_cert)
        cfg.key_file = str(self.plane.pki.admin_key)
        return k8s.ApiClient(cfg)

    def api_client_for_token(self, token: str) -> k8s.ApiClient:
        """A new ``ApiClient`` that authenticates with a bearer *token* (e.g. from :meth:`token_for`)."""
        cfg = self._configuration()
        cfg.api_key = {"authorization": token}
        cfg.api_key_prefix = {"authorization": "Bearer"}
        return k8s.ApiClient(cfg)

    def kubeconfig_for_token(self, token: str, path: Path | None = None) -> Path:
        """Write a kubeconfig that uses bearer *token*; returns its path."""
        path = path or self.workdir / "kubeconfigs" / f"token-{next(self._kubeconfig_seq)}.kubeconfig"
        return write_kubeconfig(path, server=self.url, ca_cert=self.ca_cert, user={"token": token})

    def kubectl(
        self,
        *args: str,
        kubeconfig: Path | None = None,
        check: bool = True,
        input: str | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """Run the real kubectl (admin kubeconfig unless *kubeconfig*); raises KubectlError if *check*
        and it exits non-zero."""
        argv = [str(self.binaries.kubectl), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args]
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        env["HOME"] = str(self.workdir / "home")
        proc = subprocess.run(
            argv, input=input, capture_output=True, text=True, timeout=timeout, env=env, check=False
        )
        if check and proc.returncode != 0:
            raise KubectlError(proc.returncode, argv, proc.stdout, proc.stderr)
        return proc

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: Mapping[str, str] | None = None,
        token: str | None = None,
        content_type: str = "application/json",
        timeout: float = 30,
    ) -> tuple[int, Any]:
        """A raw HTTPS call to the apiserver, as admin or with bearer *token*: no client-side
        validation in the way. Returns (HTTP status, decoded JSON body — or text if not JSON)."""
        url = self.url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        req = urllib.request.Request(url, data=data, method=method.upper())
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        ctx = ssl.create_default_context(cafile=str(self.ca_cert))
        if token is not None:
            req.add_header("Authorization", f"Bearer {token}")
        else:
            assert self.plane.pki is not None
            ctx.load_cert_chain(str(self.plane.pki.admin_cert), str(self.plane.pki.admin_key))
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
        )
        try:
            with opener.open(req, timeout=timeout) as resp:
                status, raw = int(resp.status), resp.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read()
        text = raw.decode(errors="replace")
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    # -- objects --------------------------------------------------------------------------------
    def delete_fleet_records(self, prefix: str = "gpu-healthcheck") -> int:
        """Delete every fleet record under *prefix* (brake and diag slots, the repair budget's
        records and wave markers: Leases labelled ``<prefix>/record``, in any namespace); how many.
        They outlive the Nodes they count: no garbage collector runs here."""
        status, body = self.request(
            "GET", "/apis/coordination.k8s.io/v1/leases", query={"labelSelector": f"{prefix}/record"}
        )
        if status != 200:
            raise RuntimeError(f"listing the fleet records: {status} {body}")
        for item in body["items"]:
            meta = item["metadata"]
            path = f"/apis/coordination.k8s.io/v1/namespaces/{meta['namespace']}/leases/{meta['name']}"
            status, gone = self.request("DELETE", path)
            if status not in (200, 404):
                raise RuntimeError(f"deleting {path}: {status} {gone}")
        return len(body["items"])

    def ensure_namespace(self, name: str) -> None:
        with self.api_client() as api:
            core = k8s.CoreV1Api(api)
            try:
                core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
            except k8s.ApiException as exc:
                if exc.status != 409:
                    raise

    def create_service_account(self, namespace: str, name: str) -> None:
        """Create *namespace* (if missing) and ServiceAccount *name* in it (if missing)."""
        self.ensure_namespace(namespace)
        with self.api_client() as api:
            try:
                k8s.CoreV1Api(api).create_namespaced_service_account(
                    namespace, k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name=name))
                )
            except k8s.ApiException as exc:
                if exc.status != 409:
                    raise

    def token_for(
        self,
        namespace: str,
        service_account: str,
        *,
        bound_node: str | None = None,
        expiration: int = 3600,
        audiences: Sequence[str] | None = None,
        create: bool = True,
    ) -> str:
        """Mint a token for ServiceAccount *namespace*/*service_account* with the TokenRequest API.

        With *bound_node* the token is bound to that Node object (it must exist): its claims carry
        ``kubernetes.io.node`` and it dies with the Node, as kubelet-issued tokens do. *create*
        makes the namespace and ServiceAccount first when they are missing. *expiration* >= 600.
        """
        if create:
            self.create_service_account(namespace, service_account)
        spec = k8s.V1TokenRequestSpec(audiences=list(audiences or ()), expiration_seconds=expiration)
        with self.api_client() as api:
            core = k8s.CoreV1Api(api)
            if bound_node is not None:
                node = core.read_node(bound_node)
                spec.bound_object_ref = k8s.V1BoundObjectReference(
                    kind="Node",
                    api_version="v1",
                    name=bound_node,
                    uid=node.metadata.uid if node.metadata else None,
                )
            resp = core.create_namespaced_service_account_token(
                service_account, namespace, k8s.AuthenticationV1TokenRequest(spec=spec)
            )
            assert resp.status is not None and resp.status.token
            return str(resp.status.token)

    def make_gpu_node(
        self,
        name: str,
        instance_type: str = "p5.48xlarge",
        gpus: int | None = 8,
        labels: Mapping[str, str] | None = None,
        taints: Iterable[Mapping[str, str]] | None = None,
        *,
        ready: bool = True,
        capacity: Mapping[str, str] | None = None,
    ) -> Any:
        """Create a Node that looks like a GPU node (GFD/NFD labels, ``nvidia.com/gpu`` capacity and
        allocatable set through the status subresource, a Ready condition). Returns the V1Node.

        *labels* are added to / override the defaults; *taints* are dicts like
        ``{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}``. ``gpus=None``: no
        ``nvidia.com/gpu`` at all (no device plugin: a DRA-only node).
        """
        all_labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": instance_type,
            "nvidia.com/gpu.present": "true",
            **({} if gpus is None else {"nvidia.com/gpu.count": str(gpus)}),
            "nvidia.com/gpu.product": GPU_PRODUCTS.get(instance_type, "NVIDIA-H100-80GB-HBM3"),
            **(labels or {}),
        }
        body: dict[str, Any] = {
            "metadata": {"name": name, "labels": all_labels},
            "spec": {"taints": [dict(t) for t in taints or ()]},
        }
        res = {
            "cpu": "192",
            "memory": "2097152Mi",
            "pods": "110",
            "ephemeral-storage": "7500Gi",
            **({} if gpus is None else {"nvidia.com/gpu": str(gpus)}),
            **(capacity or {}),
        }
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        conditions = [
            {
                "type": t,
                "status": s,
                "reason": r,
                "message": "set by the test fixture",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
            for t, s, r in (
                ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                ("PIDPressure", "False", "KubeletHasSufficientPID"),
                ("Ready", "True" if ready else "False", "KubeletReady" if ready else "KubeletNotReady"),
            )
        ]
        status = {
            "status": {
                "capacity": res,
                "allocatable": res,
                "conditions": conditions,
                "addresses": [{"type": "Hostname", "address": name}],
                "nodeInfo": {
                    "kubeletVersion": self.version,
                    "kubeProxyVersion": "",
                    "osImage": "test",
                    "kernelVersion": "6.8.0",
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                    "containerRuntimeVersion": "containerd://2.0.0",
                    "machineID": "",
                    "systemUUID": "",
                    "bootID": "",
                },
            }
        }
        with self.api_client() as api:
            core = k8s.CoreV1Api(api)
            core.create_node(_raw(body))
            return core.patch_node_status(name, status)

    def delete_node(self, name: str) -> None:
        with self.api_client() as api:
            try:
                k8s.CoreV1Api(api).delete_node(name)
            except k8s.ApiException as exc:
                if exc.status != 404:
                    raise

    def start_controller_manager(self) -> None:
        """Start kube-controller-manager (serviceaccount, namespace, root-ca publisher controllers only)."""
        self.plane.start_controller_manager()

    def stop(self) -> None:
        self.plane.stop()
