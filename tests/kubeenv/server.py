"""Start and stop a real etcd + kube-apiserver (+ optional kube-controller-manager) on loopback.

Every process is started in its own session (``start_new_session=True``), logs to a file in the
control plane's temp dir, is asked to die with its parent (``PR_SET_PDEATHSIG``), is registered
with ``atexit``, and is stopped by PID: SIGTERM, then SIGKILL after a few seconds.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .binaries import KubeBinaries
from .pki import Pki, make_pki

__all__ = [
    "CONTROLLERS",
    "SERVICE_ACCOUNT_ISSUER",
    "ControlPlane",
    "ControlPlaneError",
    "ManagedProcess",
    "free_ports",
    "write_kubeconfig",
]

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"  # allocation only: nothing ever sends traffic there
# Only what makes namespaces and ServiceAccounts behave. Never node-lifecycle / taint controllers:
# they would write onto the test Nodes.
CONTROLLERS = (
    "serviceaccount-controller",
    "namespace-controller",
    "root-ca-certificate-publisher-controller",
)
STOP_GRACE_S = 5.0
LOG_TAIL_LINES = 40


class ControlPlaneError(RuntimeError):
    """A control-plane process did not come up; the message carries its log tail."""


def free_ports(n: int) -> list[int]:
    """*n* distinct free TCP ports on 127.0.0.1 (all held open until all are picked)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


_LIVE: set[ManagedProcess] = set()
_LIVE_LOCK = threading.Lock()


class ManagedProcess:
    """One child process with a log file; stopped by its PID."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.popen = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        with _LIVE_LOCK:
            _LIVE.add(self)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace: float = STOP_GRACE_S) -> int | None:
        """SIGTERM by PID, SIGKILL after *grace* seconds; returns the exit code."""
        try:
            if self.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    self.popen.send_signal(signal.SIGTERM)
                try:
                    self.popen.wait(grace)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        self.popen.kill()
                    self.popen.wait(grace)
            return self.popen.returncode
        finally:
            self._log.close()
            with _LIVE_LOCK:
                _LIVE.discard(self)

    def failure(self, what: str) -> ControlPlaneError:
        code = self.popen.poll()
        state = f"exited with {code}" if code is not None else "still running"
        return ControlPlaneError(
            f"{self.name} {what} ({state}; log {self.log_path}); last lines:\n{self.tail()}"
        )


@atexit.register
def _stop_all() -> None:
    with _LIVE_LOCK:
        procs = list(_LIVE)
    for p in procs:
        with contextlib.suppress(Exception):
            p.stop(grace=2.0)


def write_kubeconfig(
    path: Path, *, server: str, ca_cert: Path, user: dict[str, str], name: str = "gpuhc-test"
) -> Path:
    """A kubeconfig (JSON, which is YAML) for one cluster/user/context."""
    cfg: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority": str(ca_cert)}}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cfg, indent=2))
    path.chmod(0o600)
    return path


def _wait(what: str, proc: ManagedProcess, ok: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        if ok():
            return
        if not proc.running():
            raise proc.failure(f"exited before {what}")
        if time.monotonic() > deadline:
            raise proc.failure(f"not {what} after {timeout:.0f}s")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.25)


class ControlPlane:
    """etcd + kube-apiserver on 127.0.0.1 free ports, in a temp dir, with fresh certificates."""

    def __init__(
        self,
        binaries: KubeBinaries,
        *,
        workdir: Path | None = None,
        extra_apiserver_args: Sequence[str] = (),
        extra_etcd_args: Sequence[str] = (),
        start_timeout: float | None = None,
        keep_workdir: bool | None = None,
    ) -> None:
        self.binaries = binaries
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="gpuhc-kube-"))
        self.extra_apiserver_args = list(extra_apiserver_args)
        self.extra_etcd_args = list(extra_etcd_args)
        self.start_timeout = start_timeout or float(os.environ.get("GPUHC_KUBE_START_TIMEOUT", "90"))
        self.keep_workdir = (
            os.environ.get("GPUHC_KUBE_KEEP_TMP", "") == "1" if keep_workdir is None else keep_workdir
        )
        self.etcd: ManagedProcess | None = None
        self.apiserver: ManagedProcess | None = None
        self.controller_manager: ManagedProcess | None = None
        self.extra_processes: list[ManagedProcess] = []
        self.pki: Pki | None = None
        self.port = 0
        self.etcd_port = 0
        self.start_seconds = 0.0
        self.controller_manager_start_seconds = 0.0
        self._failed = False

    # -- addresses ---------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_cert(self) -> Path:
        assert self.pki is not None, "control plane not started"
        return self.pki.ca_cert

    @property
    def admin_kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    def processes(self) -> list[ManagedProcess]:
        procs = (*self.extra_processes, self.controller_manager, self.apiserver, self.etcd)
        return [p for p in procs if p is not None]

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> ControlPlane:
        t0 = time.monotonic()
        try:
            self._start()
        except BaseException:
            self._failed = True
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def _start(self) -> None:
        etcd_client, etcd_peer, self.port = free_ports(3)
        self.etcd_port = etcd_client
        home = self.workdir / "home"
        home.mkdir(parents=True, exist_ok=True)
        self.etcd = ManagedProcess(
            "etcd",
            [
                str(self.binaries.etcd),
                "--name=gpuhc-test",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{etcd_client}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd_client}",
                f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-cluster=gpuhc-test=http://127.0.0.1:{etcd_peer}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
                *self.extra_etcd_args,
            ],
            self.workdir / "etcd.log",
            env=self._env(),
            cwd=self.workdir,
        )
        # Certificates are made while etcd starts.
        self.pki = pki = make_pki(self.workdir / "pki")
        write_kubeconfig(
            self.admin_kubeconfig,
            server=self.url,
            ca_cert=pki.ca_cert,
            user={"client-certificate": str(pki.admin_cert), "client-key": str(pki.admin_key)},
        )
        _wait("healthy", self.etcd, self._etcd_healthy, self.start_timeout)

        self.apiserver = ManagedProcess(
            "kube-apiserver",
            [
                str(self.binaries.kube_apiserver),
                f"--etcd-servers=http://127.0.0.1:{etcd_client}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                # Since v1.37 the endpoint reconciler refuses a loopback advertise address; nothing
                # reaches the `kubernetes` Service here, so it keeps no endpoints for it.
                "--endpoint-reconciler-type=none",
                f"--secure-port={self.port}",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                f"--tls-cert-file={pki.serving_cert}",
                f"--tls-private-key-file={pki.serving_key}",
                f"--client-ca-file={pki.ca_cert}",
                "--authorization-mode=Node,RBAC",
                # Added to the default admission plugins, as kubeadm clusters run it.
                "--enable-admission-plugins=NodeRestriction",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--api-audiences={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                "--allow-privileged=true",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                "--profiling=false",
                # 1.37 refuses a loopback advertise address with the endpoint reconciler; no Service
                # of the API server is needed here (nothing reaches it through a Service).
                "--endpoint-reconciler-type=none",
                *self.extra_apiserver_args,
            ],
            self.workdir / "kube-apiserver.log",
            env=self._env(),
            cwd=self.workdir,
        )
        _wait("ready (/readyz)", self.apiserver, self._apiserver_ready, self.start_timeout)

    def start_controller_manager(self) -> None:
        """Start kube-controller-manager with only CONTROLLERS; wait for default/default ServiceAccount."""
        if self.controller_manager is not None and self.controller_manager.running():
            return
        t0 = time.monotonic()
        self.controller_manager = self.launch_controller_manager("kube-controller-manager", CONTROLLERS)
        try:
            _wait(
                "creating the default ServiceAccount",
                self.controller_manager,
                lambda: self._get_ok("/api/v1/namespaces/default/serviceaccounts/default"),
                self.start_timeout,
            )
        except BaseException:
            self.controller_manager.stop()
            self.controller_manager = None
            raise
        self.controller_manager_start_seconds = time.monotonic() - t0

    def launch_controller_manager(
        self, name: str, controllers: Sequence[str], extra_args: Sequence[str] = ()
    ) -> ManagedProcess:
        """One more kube-controller-manager process running only *controllers* (its caller stops
        it; stop() stops it too), with *extra_args*. Tests use it for the daemonset controller,
        which the session's controller manager must not run: it would make pods for every
        DaemonSet of every test."""
        kcm = self.binaries.kube_controller_manager
        if kcm is None:
            raise ControlPlaneError(f"no kube-controller-manager in {self.binaries.dir}")
        assert self.pki is not None, "control plane not started"
        pki = self.pki
        kubeconfig = write_kubeconfig(
            self.workdir / f"{name}.kubeconfig",
            server=self.url,
            ca_cert=pki.ca_cert,
            user={
                "client-certificate": str(pki.controller_manager_cert),
                "client-key": str(pki.controller_manager_key),
            },
        )
        (port,) = free_ports(1)
        proc = ManagedProcess(
            name,
            [
                str(kcm),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / (name + '-certs')}",
                "--leader-elect=false",
                f"--controllers={','.join(controllers)}",
                "--use-service-account-credentials=true",
                f"--root-ca-file={pki.ca_cert}",
                *extra_args,
            ],
            self.workdir / f"{name}.log",
            env=self._env(),
            cwd=self.workdir,
        )
        self.extra_processes.append(proc)
        return proc

    def stop(self) -> None:
        """Stop every process this control plane started (by PID), then remove its temp dir."""
        for p in self.processes():
            p.stop()
        self.controller_manager = self.apiserver = self.etcd = None
        if self._own_workdir and not self.keep_workdir and not self._failed:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- probes ------------------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
        env["HOME"] = str(self.workdir / "home")
        return env

    def _etcd_healthy(self) -> bool:
        try:
            with _OPENER.open(f"http://127.0.0.1:{self.etcd_port}/health", timeout=2) as r:
                return bool(json.load(r).get("health") == "true")
        except (OSError, ValueError):
            return False

    def _ssl_context(self) -> ssl.SSLContext:
        assert self.pki is not None
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        ctx.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return ctx

    def _get_ok(self, path: str) -> bool:
        try:
            with urllib.request.build_opener(
                urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=self._ssl_context())
            ).open(self.url + path, timeout=5) as r:
                return bool(r.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def _apiserver_ready(self) -> bool:
        return self._get_ok("/readyz")


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
