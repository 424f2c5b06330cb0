"""Shared helpers for the benchmarks that need the real API server (outside pytest).

Starts the same etcd + kube-apiserver as the tests (tests/kubeenv, binaries from .cache/kube-bins or
$KUBEBUILDER_ASSETS), creates GPU-looking Nodes, runs agent processes on snapshot-backed nodes,
reads the API server's own request counters (`apiserver_request_total` from its /metrics) and the
agent's metrics port, and watches a Node from the benchmark process.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from agent.core.node_keys import Keys

ROOT = Path(__file__).resolve().parent.parent
HEALTHY = ROOT / "examples" / "snapshots" / "p5.48xlarge-healthy"
XID79 = ROOT / "examples" / "snapshots" / "p5.48xlarge-xid79"
TAINT = Keys().taint
XID_LINE = (
    "kern  :err   : 2025-01-21T03:12:44,118231+00:00 NVRM: Xid (PCI:0000:97:00): 79, pid='<unknown>', "
    "name=<unknown>, GPU has fallen off the bus.\n"
)

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def machine() -> str:
    """One line: CPU model, CPU count, architecture, memory, Python (what an absolute figure was
    measured on; the model as /proc/cpuinfo names it, which a VM may shorten)."""
    mem = model = ""
    with contextlib.suppress(OSError, ValueError, IndexError):
        kb = int(Path("/proc/meminfo").read_text().split("\n")[0].split()[1])
        mem = f", {kb / 1024 / 1024:.0f} GiB"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip() + ", "
                break
    return f"{model}{os.cpu_count()}-core {platform.machine()}{mem}, Python {platform.python_version()}"


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


# ---------------------------------------------------------------------------------------- API server


def start_kube(
    extra_apiserver_args: list[str] | None = None, extra_etcd_args: list[str] | None = None
) -> Any:
    """A started KubeEnv (etcd + kube-apiserver on loopback). Exits with a hint when no binaries."""
    from tests.kubeenv.binaries import KubeUnavailable, find_binaries, unavailable_message
    from tests.kubeenv.env import KubeEnv
    from tests.kubeenv.server import ControlPlane

    try:
        found = find_binaries()
    except KubeUnavailable as exc:
        raise SystemExit(unavailable_message(str(exc))) from exc
    if found is None:
        raise SystemExit(unavailable_message("no binaries in .cache/kube-bins"))
    plane = ControlPlane(
        found, extra_apiserver_args=extra_apiserver_args or [], extra_etcd_args=extra_etcd_args or []
    )
    plane.start()
    return KubeEnv(plane)


@contextlib.contextmanager
def kube_env(
    extra_apiserver_args: list[str] | None = None, extra_etcd_args: list[str] | None = None
) -> Iterator[Any]:
    env = start_kube(extra_apiserver_args, extra_etcd_args)
    try:
        yield env
    finally:
        env.stop()


def core_api(env: Any, pool: int = 16) -> Any:
    """An admin CoreV1Api whose connection pool holds *pool* connections."""
    from kubernetes import client

    api = env.api_client()
    api.configuration.connection_pool_maxsize = pool
    api.rest_client.pool_manager.connection_pool_kw["maxsize"] = pool
    return client.CoreV1Api(api)


RequestKey = tuple[str, str, str]  # (resource, verb, code)


def apiserver_metrics(env: Any, families: Collection[str], timeout: float = 60) -> Iterator[Sample]:
    """The samples of *families* (names as the Prometheus parser gives them: counters without
    `_total`) in the API server's own /metrics. Raises when /metrics cannot be read."""
    status, text = env.request("GET", "/metrics", timeout=timeout)
    if status != 200 or not isinstance(text, str):
        raise RuntimeError(f"GET /metrics answered {status}")
    for fam in text_string_to_metric_families(text):
        if fam.name in families:
            yield from fam.samples


def apiserver_requests(env: Any, resources: tuple[str, ...] = ("nodes", "events")) -> dict[RequestKey, float]:
    """`apiserver_request_total` from the API server's own /metrics, for *resources*."""
    out: dict[RequestKey, float] = defaultdict(float)
    for s in apiserver_metrics(env, ("apiserver_request",)):
        res = s.labels.get("resource", "")
        if s.name.endswith("_total") and res in resources:
            sub = s.labels.get("subresource")
            key = (f"{res}/{sub}" if sub else res, s.labels.get("verb", ""), s.labels.get("code", ""))
            out[key] += s.value
    return dict(out)


def diff(after: dict[RequestKey, float], before: dict[RequestKey, float]) -> dict[RequestKey, float]:
    keys = set(after) | set(before)
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in keys}
    return {k: v for k, v in d.items() if v}


ServedKey = tuple[str, str]  # (resource[/subresource], verb)


def apiserver_served(
    env: Any, resources: tuple[str, ...] = ("nodes", "events", "leases", "daemonsets")
) -> dict[ServedKey, tuple[float, float]]:
    """What the API server served for *resources*, from its own /metrics: per (resource, verb) the
    requests (`apiserver_request_total`, every code) and the response bytes (`apiserver_response_sizes`,
    its sum: what a LIST, GET, PATCH ... answered; a WATCH's stream is not in it, see
    watch_event_bytes)."""
    reqs: dict[ServedKey, float] = defaultdict(float)
    sizes: dict[ServedKey, float] = defaultdict(float)
    for s in apiserver_metrics(env, ("apiserver_request", "apiserver_response_sizes")):
        res = s.labels.get("resource", "")
        if res not in resources:
            continue
        sub = s.labels.get("subresource")
        key = (f"{res}/{sub}" if sub else res, s.labels.get("verb", ""))
        if key == ("leases", "PUT"):
            continue  # the API server's own identity Lease, every 10 s (no agent updates a Lease)
        if s.name == "apiserver_request_total":
            reqs[key] += s.value
        elif s.name == "apiserver_response_sizes_sum":
            sizes[key] += s.value
    return {k: (reqs.get(k, 0.0), sizes.get(k, 0.0)) for k in set(reqs) | set(sizes)}


def watch_event_bytes(
    env: Any, resources: tuple[str, ...] = ("nodes", "events", "leases")
) -> dict[str, float]:
    """Bytes of watch events the API server sent, by resource (`apiserver_watch_events_sizes` sum)."""
    out: dict[str, float] = defaultdict(float)
    for s in apiserver_metrics(env, ("apiserver_watch_events_sizes",)):
        if s.name.endswith("_sum") and s.labels.get("resource", "") in resources:
            out[s.labels["resource"]] += s.value
    return dict(out)


class Meter:
    """The API server's load between two marks: requests and bytes served (by resource and verb),
    watch event bytes, and its CPU seconds; peak RSS per mark from a MemoryGuard's samples."""

    def __init__(
        self, env: Any, pid: int, guard: MemoryGuard | None = None, name: str = "kube-apiserver"
    ) -> None:
        self.env, self.pid, self.guard, self.name = env, pid, guard, name
        self._last = self._sample()

    def _sample(self) -> dict[str, Any]:
        return {
            "served": apiserver_served(self.env),
            "watch": watch_event_bytes(self.env),
            "cpu": proc_cpu_s(self.pid),
            "t": time.monotonic(),
        }

    def mark(self) -> dict[str, Any]:
        """The load since the last mark: {"served": {(res, verb): (requests, bytes)}, "watch_bytes",
        "cpu_s", "seconds", "peak_rss_kb"}."""
        now = self._sample()
        before = self._last
        self._last = now
        served = {}
        for key in set(now["served"]) | set(before["served"]):
            r1, b1 = now["served"].get(key, (0.0, 0.0))
            r0, b0 = before["served"].get(key, (0.0, 0.0))
            if r1 - r0 or b1 - b0:
                served[key] = (r1 - r0, b1 - b0)
        watch = {k: v - before["watch"].get(k, 0.0) for k, v in now["watch"].items()}
        peak = self.guard.take_phase_peak(self.name) if self.guard is not None else proc_rss_kb(self.pid)
        return {
            "served": served,
            "watch_bytes": {k: v for k, v in watch.items() if v},
            "cpu_s": now["cpu"] - before["cpu"],
            "seconds": now["t"] - before["t"],
            "peak_rss_kb": peak,
        }


def phase_lines(name: str, phase: dict[str, Any], agents: int, failing: int = 0) -> list[str]:
    """A phase's load as printed lines: requests and bytes per agent (and per failing node), the
    API server's CPU and peak RSS per 1,000 agents. Watches apart: a WATCH's count is its opening,
    its bytes are its stream (a timed-out watch re-opens whenever its timeout says, not per fault)."""
    served = phase["served"]
    reqs = sum(r for (_, verb), (r, _) in served.items() if verb != "WATCH")
    body = sum(b for (_, verb), (_, b) in served.items() if verb != "WATCH")
    watches = sum(r for (_, verb), (r, _) in served.items() if verb == "WATCH")
    watch = sum(phase["watch_bytes"].values())
    cpu, rss = phase["cpu_s"], phase["peak_rss_kb"] / 1024
    per = f"per agent {reqs / agents:.2f} requests, {body / agents / 1024:.2f} KiB"
    if failing:
        per += f"; per failing node {reqs / failing:.2f} requests, {body / failing / 1024:.2f} KiB"
    lines = [
        f"{name} ({phase['seconds']:.0f} s): {reqs:.0f} requests, {body / 1024:.0f} KiB served; "
        f"{watches:.0f} watches (re)opened, watch events {watch / 1024:.0f} KiB; {per}",
        f"  kube-apiserver CPU {cpu:.1f} s ({cpu / agents * 1000:.2f} s per 1,000 agents), "
        f"peak RSS {rss:.0f} MiB ({rss / agents * 1000:.0f} MiB per 1,000 agents)",
    ]
    for (res, verb), (r, b) in sorted(served.items()):
        lines.append(f"  {res:<14} {verb:<7} {r:>8.0f} requests {b / 1024:>10.1f} KiB")
    return lines


def longrunning_watches(env: Any, resource: str = "nodes") -> float:
    """Open WATCH requests on *resource* right now (`apiserver_longrunning_requests`)."""
    return sum(
        s.value
        for s in apiserver_metrics(env, ("apiserver_longrunning_requests",))
        if s.labels.get("resource") == resource and s.labels.get("verb") == "WATCH"
    )


def node_list_sources(env: Any) -> dict[str, float]:
    """Where the API server served Node LISTs from: its watch cache (`apiserver_cache_list_total`) or
    etcd (`etcd_requests_total{operation="list"}`), and how many objects it read from etcd for them."""
    out = {"cache": 0.0, "etcd": 0.0, "etcd_objects": 0.0}
    wanted = {
        "apiserver_cache_list_total": "cache",
        "etcd_requests_total": "etcd",
        "apiserver_storage_list_fetched_objects_total": "etcd_objects",
    }
    families = [name.removesuffix("_total") for name in wanted]
    for s in apiserver_metrics(env, families):
        key = wanted.get(s.name)
        if key is None or s.labels.get("resource") != "nodes" or s.labels.get("group", "") != "":
            continue
        if key == "etcd" and s.labels.get("operation") != "list":
            continue
        out[key] += s.value
    return out


def request_latency_buckets(env: Any, resource: str = "nodes") -> dict[tuple[str, float], float]:
    """`apiserver_request_duration_seconds` buckets for *resource* by (verb, upper bound): the time the
    API server spent on each request, whatever the client's own timeouts made of it."""
    out: dict[tuple[str, float], float] = defaultdict(float)
    for s in apiserver_metrics(env, ("apiserver_request_duration_seconds",)):
        if (
            s.name.endswith("_bucket")
            and s.labels.get("resource") == resource
            and not s.labels.get("subresource")
        ):
            out[(s.labels.get("verb", ""), float(s.labels["le"]))] += s.value
    return dict(out)


def bucket_quantile(buckets: dict[tuple[str, float], float], verb: str, q: float) -> tuple[float, float]:
    """(upper bound of the bucket holding quantile *q*, request count) from cumulative buckets."""
    mine = sorted((le, n) for (v, le), n in buckets.items() if v == verb)
    if not mine or mine[-1][1] <= 0:
        return 0.0, 0.0
    total = mine[-1][1]
    for le, n in mine:
        if n >= q * total:
            return le, total
    return mine[-1][0], total


def proc_kb(path: str, field: str) -> int:
    """The `Field:  N kB` line of a /proc file (status, meminfo); 0 when absent or the process is gone."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(path).read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def mem_available_kb() -> int:
    return proc_kb("/proc/meminfo", "MemAvailable")


def proc_rss_kb(pid: int | str, field: str = "VmRSS") -> int:
    """VmRSS (or another status field, e.g. VmHWM, the peak) of *pid* ("self" for this process)."""
    return proc_kb(f"/proc/{pid}/status", field)


def proc_cpu_s(pid: int) -> float:
    """user + system CPU seconds of *pid* (all threads), 0 when it is gone."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


class MemoryGuard:
    """Samples the RSS of named processes and the machine's MemAvailable; when MemAvailable falls
    below *floor_mib* it calls *on_trip* once (the benchmark stops its load) instead of letting the
    kernel's OOM killer pick a victim. Peaks are kept for the report."""

    def __init__(self, floor_mib: int, on_trip: Callable[[], None], interval: float = 0.5) -> None:
        self.floor_kb = floor_mib * 1024
        self.on_trip = on_trip
        self.interval = interval
        self.pids: dict[str, list[int]] = {}
        self.peak_kb: dict[str, int] = {}
        self.phase_peak_kb: dict[str, int] = {}  # since the last take_phase_peak (Meter's phases)
        self.min_available_kb = mem_available_kb()
        self.tripped = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-guard", daemon=True)

    def watch(self, name: str, pid: int) -> None:
        self.pids.setdefault(name, []).append(pid)

    def start(self) -> MemoryGuard:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for name, pids in list(self.pids.items()):
                rss = sum(proc_rss_kb(p) for p in pids)
                self.peak_kb[name] = max(self.peak_kb.get(name, 0), rss)
                self.phase_peak_kb[name] = max(self.phase_peak_kb.get(name, 0), rss)
            avail = mem_available_kb()
            self.min_available_kb = min(self.min_available_kb, avail)
            if avail and avail < self.floor_kb and not self.tripped.is_set():
                self.tripped.set()
                self.on_trip()

    def take_phase_peak(self, name: str) -> int:
        """The peak RSS (kB) of *name* since the last call, then start a new phase."""
        pids = self.pids.get(name, [])
        now = sum(proc_rss_kb(p) for p in pids)
        peak = max(self.phase_peak_kb.get(name, 0), now)
        self.phase_peak_kb[name] = now
        return peak

    def report(self) -> str:
        peaks = ", ".join(f"{n} {kb / 1024:.0f}" for n, kb in self.peak_kb.items())
        return f"peak RSS MiB: {peaks}; lowest MemAvailable {self.min_available_kb / 1024:.0f} MiB"


# ---------------------------------------------------------------------------------------- nodes / agent


def agent_daemonset(env: Any, desired: int, namespace: str = "gpu-healthcheck") -> None:
    """The agent DaemonSet as the simulated agents' brake reads it (reporters/gpu_total.py): its pods
    run as gpu-healthcheck-agent, and its status says *desired* nodes, as the DaemonSet controller
    would write it for *desired* GPU nodes (no controller runs: the agents are simulated, no pod is
    made)."""
    env.ensure_namespace(namespace)
    labels = {"app.kubernetes.io/name": "gpu-healthcheck-agent"}
    body = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "gpu-healthcheck-agent", "namespace": namespace, "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": "gpu-healthcheck-agent",
                    "containers": [{"name": "agent", "image": "gpu-healthcheck:bench"}],
                },
            },
        },
    }
    path = f"/apis/apps/v1/namespaces/{namespace}/daemonsets"
    status, doc = env.request("POST", path, body)
    if status != 201:
        raise RuntimeError(f"creating the agent DaemonSet: {status} {doc}")
    doc["status"] = {
        "desiredNumberScheduled": desired,
        "currentNumberScheduled": desired,
        "numberMisscheduled": 0,
        "numberReady": desired,
    }
    status, doc = env.request("PUT", f"{path}/gpu-healthcheck-agent/status", doc)
    if status != 200:
        raise RuntimeError(f"writing the agent DaemonSet's status: {status} {doc}")


def snapshot_copy(dest: Path, src: Path = HEALTHY) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, symlinks=True)
    return dest


def write_config(dest: Path, yaml_text: str) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.yaml").write_text(yaml_text)
    return dest


def service_account_dir(
    env: Any, dest: Path, namespace: str = "gpu-healthcheck", name: str = "bench-agent"
) -> Path:
    """A pod's service-account mount (token, ca.crt) for an agent process run as in a pod: its
    ServiceAccount bound to cluster-admin (what the agent's RBAC allows is the tests' business, not
    the benchmarks'), a one-hour token from the TokenRequest API."""
    env.create_service_account(namespace, name)
    binding = {
        "metadata": {"name": f"{name}-{namespace}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
    }
    status, body = env.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
    if status not in (201, 409):
        raise RuntimeError(f"binding {name} to cluster-admin: {status} {body}")
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "token").write_text(env.token_for(namespace, name, expiration=3600))
    (dest / "ca.crt").write_bytes(Path(env.ca_cert).read_bytes())
    return dest


class AgentProcess:
    """`gpu-healthcheck agent` on a snapshot-backed node, as a child process (stopped by PID).

    With *service_account* (a directory from service_account_dir) it runs as in a pod: the
    client's in-cluster loader, KUBERNETES_SERVICE_HOST/PORT, no kubeconfig; else with a kubeconfig
    (default: the admin's). *root*: the checkout whose agent runs (default: this one), so that one
    benchmark run can measure an older checkout's agent beside this one's."""

    def __init__(
        self,
        env: Any,
        node: str,
        snap: Path,
        config_dir: Path,
        log: Path,
        metrics_port: int = 0,
        kubeconfig: Path | None = None,
        log_level: str = "warning",
        *,
        service_account: Path | None = None,
        root: Path = ROOT,
        extra: Sequence[str] = (),
    ) -> None:
        self.log = log
        self.metrics_port = metrics_port
        argv = [sys.executable, "-m", "agent.cli", "agent", "--node", node, "--from-snapshot", str(snap)]
        argv += ["--config-dir", str(config_dir), "--metrics-port", str(metrics_port)]
        child_env = dict(os.environ, PYTHONUNBUFFERED="1", GPU_HEALTHCHECK_LOG_LEVEL=log_level)
        if service_account is not None:
            host, port = env.url.removeprefix("https://").rsplit(":", 1)
            argv += ["--service-account-dir", str(service_account)]
            child_env.pop("KUBECONFIG", None)
            child_env |= {"KUBERNETES_SERVICE_HOST": host.strip("[]"), "KUBERNETES_SERVICE_PORT": port}
            child_env["NO_PROXY"] = ",".join(filter(None, (child_env.get("NO_PROXY"), host.strip("[]"))))
        else:
            argv += ["--kubeconfig", str(kubeconfig or env.kubeconfig)]
        argv += list(extra)  # more `agent` options (steady_state --canary: --canary-config-dir)
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, cwd=root, env=child_env
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def metrics(self) -> dict[str, float]:
        """The agent's /metrics as {'name{label=value,...}': value}."""
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5
        ) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}"] = s.value
        return out


def metric_sum(metrics: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in metrics.items() if k.startswith(prefix))


def our_taint(node: dict[str, Any]) -> dict[str, Any] | None:
    return next((t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") == TAINT), None)


def wait_for(pred: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


class NodeWatch:
    """Watches one Node from the benchmark process; each event is queued with its perf_counter()
    receipt time, so latency is measured on the benchmark's own clock."""

    def __init__(self, core: Any, name: str) -> None:
        self.core = core
        self.name = name
        self.events: queue.Queue[tuple[float, dict[str, Any]]] = queue.Queue()
        self._stop = threading.Event()
        self._w: Any = None
        self._thread = threading.Thread(target=self._run, name=f"bench-watch-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from kubernetes import watch

        while not self._stop.is_set():
            try:
                self._w = watch.Watch()
                for ev in self._w.stream(
                    self.core.list_node,
                    field_selector=f"metadata.name={self.name}",
                    timeout_seconds=600,
                    _request_timeout=(5, 630),
                ):
                    t = time.perf_counter()
                    if ev.get("type") in ("ADDED", "MODIFIED"):
                        self.events.put((t, ev.get("raw_object") or {}))
            except Exception:
                if not self._stop.is_set():
                    time.sleep(0.2)

    def drain(self) -> dict[str, Any] | None:
        """Drop queued events; return the newest Node seen (None if none queued)."""
        last = None
        while True:
            try:
                last = self.events.get_nowait()[1]
            except queue.Empty:
                return last

    def wait(self, pred: Callable[[dict[str, Any]], bool], timeout: float) -> float:
        """perf_counter() at receipt of the first event whose Node satisfies *pred*."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no matching watch event for {self.name} in {timeout:.0f} s")
            try:
                t, node = self.events.get(timeout=left)
            except queue.Empty:
                continue
            if pred(node):
                return t

    def stop(self) -> None:
        self._stop.set()
        w = self._w
        if w is not None:
            with contextlib.suppress(Exception):
                w.stop()


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


TRACE_FAMILIES = (
    "apiserver_watch_cache_consistent_read",
    "apiserver_cache_list",
    "etcd_requests",
    "apiserver_storage_list_fetched_objects",
    "apiserver_current_inflight_requests",
    "apiserver_flowcontrol_current_inqueue_requests",
    "apiserver_longrunning_requests",
    "go_memstats_heap_inuse_bytes",
    "apiserver_watch_events",
    "apiserver_watch_events_sizes",
    "apiserver_request",
)


class ApiserverTrace:
    """Every *interval* seconds, one line of the API server's own metrics that explain its load
    (where LISTs are served from, consistent-read fallbacks to etcd, requests in flight, watch event
    volume, Go heap) plus the RSS of the control plane, to *path*: what to read when a run grows."""

    def __init__(self, env: Any, path: Path, pids: dict[str, int], interval: float = 5.0) -> None:
        self.env = env
        self.path = path
        self.pids = pids
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="apiserver-trace", daemon=True)
        self._t0 = time.monotonic()

    def start(self) -> ApiserverTrace:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def sample(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        keep = ("resource", "verb", "operation", "fallback", "success", "code", "request_kind")
        for s in apiserver_metrics(self.env, TRACE_FAMILIES, timeout=30):
            if s.labels.get("resource", "") not in ("", "nodes", "events"):
                continue
            if s.name.endswith(("_bucket", "_created")):
                continue
            labels = ",".join(f"{k}={s.labels[k]}" for k in keep if s.labels.get(k))
            out[f"{s.name}{{{labels}}}"] += s.value
        return dict(out)

    def _run(self) -> None:
        with self.path.open("a") as f:
            while not self._stop.wait(self.interval):
                try:
                    sample = self.sample()
                except Exception as exc:  # an overloaded server: note it and go on
                    sample = {"error": 1.0}
                    f.write(f"# {time.monotonic() - self._t0:.0f}s sample failed: {exc}\n")
                rss = {n: proc_rss_kb(p) // 1024 for n, p in self.pids.items()}
                line = {"t": round(time.monotonic() - self._t0, 1), "rss_mib": rss, "metrics": sample}
                f.write(json.dumps(line) + "\n")
                f.flush()
