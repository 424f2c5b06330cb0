"""The engine's guard: the only way into nv-hostengine from outside its pod.

DCGM 4.6's API has no authentication and can inject faults, and nv-hostengine offers no switch to turn
injection off (`-b` bind address, `-d` Unix socket, `--denylist-modules` for whole modules; the core
module that injects cannot be denied). A NetworkPolicy guards it only where the CNI enforces policies.
So the engine listens on 127.0.0.1 inside its own pod (DCGM's default bind address: nothing outside the
pod reaches it), and this guard listens on the pod IP behind the `internalTrafficPolicy: Local` Service
and forwards a connection only when its source IP belongs to an allowed pod on this node: a Running pod
in an allowed namespace matching the label selector (the agent, dcgm-exporter, the quarantine Job), as
listed by the API server. Everything else is refused and logged, whatever the CNI does.

Stdlib only (the engine image installs no dependencies): the pod list is one GET per namespace with the
pod's ServiceAccount token. The list is refreshed every `max_age_s` and, at most every `min_refresh_s`,
when an unknown address knocks (a new agent pod gets in within seconds). Unreadable API: the last good
list stays; none yet: everything is refused (fail closed).
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import ssl
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("hostengine.guard")
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_SELECTOR = (
    "app.kubernetes.io/name in (gpu-healthcheck-agent,dcgm-exporter,gpu-healthcheck-quarantine)"
)


@dataclass(frozen=True)
class Api:
    """Where and how to ask the API server: in a pod, from its ServiceAccount files."""

    url: str
    token: Callable[[], str]
    ca_file: str | None

    @classmethod
    def in_cluster(cls, host: str, port: str, sa_dir: Path = SA_DIR) -> Api:
        ip = f"[{host}]" if ":" in host else host
        return cls(
            f"https://{ip}:{port}", lambda: (sa_dir / "token").read_text().strip(), str(sa_dir / "ca.crt")
        )

    def get(self, path: str, query: dict[str, str], timeout_s: float = 10.0) -> dict[str, object]:
        req = urllib.request.Request(f"{self.url}{path}?{urllib.parse.urlencode(query)}")
        req.add_header("Authorization", f"Bearer {self.token()}")
        req.add_header("Accept", "application/json")
        ctx = ssl.create_default_context(cafile=self.ca_file)
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
        )
        with opener.open(req, timeout=timeout_s) as resp:
            doc = json.loads(resp.read())
        if not isinstance(doc, dict):
            raise ValueError(f"GET {path}: not a JSON object")
        return doc


def allowed_pod_ips(api: Api, node: str, namespaces: Iterable[str], selector: str) -> set[str]:
    """IPs of the Running pods on `node` in `namespaces` that match the label `selector` (several
    selectors separated by ";" are alternatives, e.g. the GPU Operator's exporter is `app=...`)."""
    ips: set[str] = set()
    for ns, sel in ((n, s.strip()) for n in namespaces for s in selector.split(";") if s.strip()):
        doc = api.get(
            f"/api/v1/namespaces/{urllib.parse.quote(ns)}/pods",
            {"labelSelector": sel, "fieldSelector": f"spec.nodeName={node},status.phase=Running"},
        )
        items = doc.get("items")
        for pod in items if isinstance(items, list) else []:
            status = pod.get("status", {}) if isinstance(pod, dict) else {}
            ips.update(
                str(p["ip"]) for p in status.get("podIPs") or [] if isinstance(p, dict) and p.get("ip")
            )
            if status.get("podIP"):
                ips.add(str(status["podIP"]))
    return ips


class Allowlist:
    """Which source addresses may reach the engine; `fetch` lists them (raises when it cannot)."""

    def __init__(
        self,
        fetch: Callable[[], set[str]],
        *,
        max_age_s: float = 60.0,
        min_refresh_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch, self._clock = fetch, clock
        self.max_age_s, self.min_refresh_s = max_age_s, min_refresh_s
        self._ips: set[str] | None = None
        self._fetched_at = float("-inf")
        self._tried_at = float("-inf")
        self._lock = threading.Lock()
        self.last_error = ""

    def refresh(self) -> None:
        with self._lock:
            self._tried_at = self._clock()
            try:
                ips = self._fetch()
            except Exception as exc:  # keep the last good list; none yet: refuse everyone
                self.last_error = f"{type(exc).__name__}: {exc}"
                keep = "keeping the last list" if self._ips is not None else "refusing every client"
                log.warning("guard: cannot list the allowed pods (%s); %s", self.last_error, keep)
                return
            if ips != self._ips:
                log.info("guard: allowed clients on this node: %s", ", ".join(sorted(ips)) or "none")
            self._ips, self._fetched_at, self.last_error = ips, self._tried_at, ""

    def allows(self, ip: str) -> bool:
        now = self._clock()
        known = self._ips is not None and ip in self._ips
        stale = now - self._fetched_at >= self.max_age_s
        if (stale or not known) and now - self._tried_at >= self.min_refresh_s:
            self.refresh()
        return self._ips is not None and ip in self._ips


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (dst, src):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


class Guard:
    """Accept on (listen_host, listen_port); forward allowed peers to the engine at (engine_host, port)."""

    def __init__(
        self, listen_host: str, listen_port: int, engine_host: str, engine_port: int, allowlist: Allowlist
    ) -> None:
        family = socket.AF_INET6 if ":" in listen_host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((listen_host, listen_port))
        self.sock.listen(64)
        self.engine = (engine_host, engine_port)
        self.allowlist = allowlist
        self.refused = 0
        self.accepted = 0
        self._refused_logged: dict[str, float] = {}
        self._stop = threading.Event()

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def serve_forever(self) -> None:
        self.sock.settimeout(0.5)
        while not self._stop.is_set():
            try:
                conn, peer = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                raise
            threading.Thread(target=self._handle, args=(conn, str(peer[0])), daemon=True).start()

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.serve_forever, name="hostengine-guard", daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self._stop.set()
        self.sock.close()

    def _handle(self, conn: socket.socket, ip: str) -> None:
        if not self.allowlist.allows(ip):
            self.refused += 1
            now = time.monotonic()
            if now - self._refused_logged.get(ip, float("-inf")) >= 60:
                self._refused_logged[ip] = now
                log.warning("guard: refused a connection from %s (not an allowed pod on this node)", ip)
            conn.close()
            return
        try:
            upstream = socket.create_connection(self.engine, timeout=5)
        except OSError as exc:
            log.warning("guard: engine at %s:%d not reachable: %s", *self.engine, exc)
            conn.close()
            return
        upstream.settimeout(None)
        self.accepted += 1
        threading.Thread(target=_pump, args=(conn, upstream), daemon=True).start()
        _pump(upstream, conn)
        conn.close()
        upstream.close()
