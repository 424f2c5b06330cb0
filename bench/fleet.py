"""Fleet scale: N simulated agents against one real API server; steady state, then a fault on 40 %.

Usage: python -m bench.fleet [--nodes 100] [--processes 1] [--steady-seconds 60] [--fault-fraction 0.4]
       [--workers 32]

What is simulated (--processes K simulator processes, each with N/K node identities): for each of N GPU
Nodes, the agent's real Node-side code, `agent.reporters.node_writer.NodeWriter` with its own
`agent.reporters.brake.Brake` (default config: maxTaintedFraction 0.2); the identities of one process
share its kubernetes ApiClient, whose connection pool holds its share + 32 connections. The parent
process runs the API server, creates the Nodes, picks the faulty ones, tells the processes when the
fault happens and merges their counts. --workers concurrent applies are split over the processes, and
each process opens its watches that many at a time (the next batch once the last one has read its Nodes)
so that the API server, not thousands of simultaneous TLS handshakes in one process, paces the start.
At N=2000 one process does not fit a 2-core machine (see bench/README.md); use --processes 4.
Each NodeWriter runs its own watch of its own Node (one thread and one
long-running WATCH per node, as each agent process has). What is not run per node: the engine and the
checks. Their output is taken from a real Engine: the Marks of the healthy p5.48xlarge snapshot and
of the Xid 79 snapshot, computed once and given to every writer (with the Events the agent posts with
them). The agent loop calls apply() only when its Marks change and, after a failed apply, again with
backoff 1, 2, 4 ... 30 s; the simulation does the same.

Phases:
1. start: create N Nodes, start N watches, apply the healthy Marks on every node (W workers).
2. steady state (--steady-seconds): nothing changes; `apiserver_request_total` (nodes, events) is read
   before and after; printed by verb with the rate per node-hour.
3. fault: --fault-fraction of the nodes get the failing Marks at the same moment (W workers at once).
   Each simulated agent then does what the agent loop does: retry a failed apply with backoff, and
   while the brake holds its taint back ask again every min(30 s, intervals.gpu) (--reask-seconds),
   through the agent's own WritePolicy (agent/engine/write_policy.py).
   The writers' own post-taint re-count (a racing agent beyond the limit yields) runs as in the agent.
   Reported over --observe-seconds: taints (vs the brake's limit), nodes labelled fail, requests by
   verb, API errors (non-2xx counted at the server; failed applies and writer warnings counted in the
   process), and the time until the fleet's marks are stable: the last change of any of our keys
   (labels, taint, condition, results annotation) on any Node, seen by one watch of all Nodes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import multiprocessing
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agent.config import Config, load_config_dir
from agent.core.marks import Marks
from agent.engine.engine import Engine
from agent.engine.write_policy import WritePolicy, brake_reask_s
from agent.probes.snapshot import SnapshotSource
from agent.reporters.brake import METADATA_LIST_ACCEPT, Brake
from agent.reporters.kube_rest import KubeRest
from agent.reporters.node_writer import NodeWriter
from bench._kube import (
    HEALTHY,
    XID79,
    ApiserverTrace,
    MemoryGuard,
    Meter,
    agent_daemonset,
    apiserver_requests,
    bucket_quantile,
    core_api,
    diff,
    kube_env,
    machine,
    node_list_sources,
    phase_lines,
    proc_cpu_s,
    proc_rss_kb,
    request_latency_buckets,
)

BRAKE_WARM_JITTER_S = 30.0  # the old agent read the GPU-node total at start after a delay this long
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
PREFIX = "gpu-healthcheck/"


class Counted(logging.Handler):
    """Counts the writers' warnings (failed writes, failed watches)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0
        self.yields = 0
        self.samples: list[str] = []
        self._lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._lock:
            self.count += 1
            if "yielding" in record.getMessage():
                self.yields += 1  # the post-taint re-count working as designed, not an error
            elif len(self.samples) < 5:
                self.samples.append(record.getMessage()[:200])


def marks_of(snapshot: Path) -> Marks:
    engine = Engine(SnapshotSource(snapshot), load_config_dir())
    for tier in ("gpu", "xid", "efa", "topology"):
        engine.run_tier(tier)
    return engine.evaluate()[1]


def create_node(core: Any, name: str) -> None:
    labels = {
        "kubernetes.io/hostname": name,
        "node.kubernetes.io/instance-type": "p5.48xlarge",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.product": GPU_PRODUCT,
    }
    core.create_node({"metadata": {"name": name, "labels": labels}})
    res = {"cpu": "192", "memory": "2097152Mi", "pods": "110", "nvidia.com/gpu": "8"}
    core.patch_node_status(name, {"status": {"capacity": res, "allocatable": res}})


def count_nodes(core: Any, selector: str) -> int:
    """Nodes matching *selector* (a consistent read: the run is over)."""
    query = {"labelSelector": selector}
    doc = KubeRest.of(core).json("GET", "/api/v1/nodes", query=query, accept=METADATA_LIST_ACCEPT)
    return len(doc.get("items") or ())


def tainted_nodes(core: Any) -> int:
    doc = KubeRest.of(core).json("GET", "/api/v1/nodes")
    return sum(
        1
        for n in doc.get("items") or ()
        if any(t.get("key") == "gpu-healthcheck/unhealthy" for t in n["spec"].get("taints") or ())
    )


class MarksWatch:
    """One watch of all Nodes in the benchmark: when did our keys last change on any Node?"""

    def __init__(self, core: Any) -> None:
        self.last_change = 0.0
        self.changes = 0
        self._seen: dict[str, tuple[Any, ...]] = {}
        self.tainted: set[str] = set()
        self.peak_tainted = 0  # the most Nodes carrying our taint at one time, as this watch saw them
        self.restarts = 0  # the watch was closed by the API server and re-listed
        self._w: Any = None
        self._stop = threading.Event()
        self._rest = KubeRest.of(core)
        doc = self._rest.json("GET", "/api/v1/nodes")
        for node in doc.get("items") or ():
            self._seen[node["metadata"]["name"]] = self.signature(node)
        self._rv = doc["metadata"]["resourceVersion"]
        threading.Thread(target=self._run, daemon=True).start()

    @staticmethod
    def signature(node: dict[str, Any]) -> tuple[Any, ...]:
        meta = node.get("metadata") or {}
        labels = {k: v for k, v in (meta.get("labels") or {}).items() if k.startswith(PREFIX)}
        taints = [t for t in (node.get("spec") or {}).get("taints") or () if t["key"].startswith(PREFIX)]
        cond = [
            (c.get("status"), c.get("reason"))
            for c in (node.get("status") or {}).get("conditions") or ()
            if c.get("type") == "GPUHealthy"
        ]
        results = (meta.get("annotations") or {}).get("gpu-healthcheck/results", "")
        return (sorted(labels.items()), json.dumps(taints, sort_keys=True), cond, hash(results))

    def _run(self) -> None:
        rv = self._rv
        while not self._stop.is_set():
            self._w = self._rest.watch(  # raw events, as the agents read theirs
                "/api/v1/nodes", query={"resourceVersion": rv, "timeoutSeconds": 3600}, timeout=(5, 3700)
            )
            try:
                for ev in self._w:
                    if self._stop.is_set():
                        return
                    node = ev.get("object") or {}
                    rv = (node.get("metadata") or {}).get("resourceVersion") or rv
                    if ev.get("type") in ("ADDED", "MODIFIED"):
                        self._see(node)
            except Exception:
                # The API server closes a watch that falls behind a burst ("Response ended
                # prematurely"): list again (changes missed meanwhile are counted when seen) and go on.
                if self._stop.is_set():
                    return
                self.restarts += 1
                with contextlib.suppress(Exception):
                    doc = self._rest.json("GET", "/api/v1/nodes")
                    for node in doc.get("items") or ():
                        self._see(node)
                    rv = doc["metadata"]["resourceVersion"]

    def _see(self, node: dict[str, Any]) -> None:
        name = (node.get("metadata") or {}).get("name", "")
        taints = (node.get("spec") or {}).get("taints") or ()
        if any(t.get("key") == "gpu-healthcheck/unhealthy" for t in taints):
            self.tainted.add(name)
            self.peak_tainted = max(self.peak_tainted, len(self.tainted))
        else:
            self.tainted.discard(name)
        sig = self.signature(node)
        if self._seen.get(name) != sig:
            self._seen[name] = sig
            self.changes += 1
            self.last_change = time.perf_counter()

    def stop(self) -> None:
        self._stop.set()
        if self._w is not None:
            self._w.stop()


def by_verb(d: dict[tuple[str, str, str], float]) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for (res, verb, _code), n in d.items():
        out[(res, verb)] = out.get((res, verb), 0.0) + n
    return out


def errors_of(d: dict[tuple[str, str, str], float]) -> dict[str, float]:
    return {f"{r} {v} {c}": n for (r, v, c), n in d.items() if not c.startswith("2")}


def apply_until_ok(writer: NodeWriter, marks: Marks, failures: list[int], cfg: Config) -> float:
    """The agent loop's behaviour (its WritePolicy): apply; on failure retry with backoff. Returns
    perf_counter at ok."""
    policy = WritePolicy(lambda: brake_reask_s(cfg))
    while True:
        res = writer.apply(marks)
        marks = replace(marks, events=())  # the writer keeps unsent Events; the engine sends them once
        wait = policy.next_try(res)
        if res.ok:
            return time.perf_counter()
        failures.append(1)
        time.sleep(wait or 0.0)


def new_writer(core: Any, name: str, cfg: Config) -> NodeWriter:
    brake = Brake(
        core,
        cfg=cfg,
    )
    return NodeWriter(core, name, brake=brake, cfg=cfg)


def start_watches(writers: list[NodeWriter], batch: int, timeout: float = 120.0) -> None:
    """Start the writers' watches *batch* at a time, each batch once its Nodes have been read (the
    watch's first step), so the start is paced by the API server rather than by thousands of
    simultaneous TLS handshakes in one process."""
    for i in range(0, len(writers), batch):
        group = writers[i : i + batch]
        for w in group:
            w.start()
        deadline = time.monotonic() + timeout
        for w in group:
            while w.node is None and time.monotonic() < deadline:
                time.sleep(0.02)


def shard(
    idx: int,
    kubeconfig: str,
    names: list[str],
    bad: list[str],
    workers: int,
    reask_s: float | None,
    spread_s: float,
    seed: int,
    results: Any,
    go_mp: Any,
    stop_mp: Any,
) -> None:
    """One simulator process: its share of the node identities, with its own ApiClient (pool share + 32).
    Reports ("ready", ...) after the first marks are on all its Nodes and ("done", ...) after the fault."""
    from kubernetes import config as kconfig
    from kubernetes.client import CoreV1Api

    threading.stack_size(512 * 1024)
    counted = Counted()
    reporters = logging.getLogger("agent.reporters")  # the writer, its taint gate, watch, Events, brake
    reporters.addHandler(counted)
    reporters.setLevel(logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    healthy, failing = marks_of(HEALTHY), marks_of(XID79)
    cfg = load_config_dir()
    new_client: Any = kconfig.new_client_from_config
    api = new_client(config_file=kubeconfig)
    pool = len(names) + 32
    api.configuration.connection_pool_maxsize = pool
    api.rest_client.pool_manager.connection_pool_kw["maxsize"] = pool
    core = CoreV1Api(api)
    writers = [new_writer(core, name, cfg) for name in names]
    t0 = time.monotonic()
    start_watches(writers, workers)
    watched = time.monotonic() - t0
    start_failures: list[int] = []
    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(lambda w: apply_until_ok(w, healthy, start_failures, cfg), writers))
    # As each agent does at start: read the fleet's GPU-node total after a random delay (the brake
    # needs it before a first taint); done before "ready", so it is not in the steady-state window.
    warm_rng = random.Random(seed * 1000 + idx)
    warming = [
        w.brake.warm(warm_rng.uniform(0, BRAKE_WARM_JITTER_S))
        for w in writers
        if w.brake and hasattr(w.brake, "warm")  # (an agent that reads nothing at start has none)
    ]
    for thread in warming:
        if thread is not None:
            thread.join(BRAKE_WARM_JITTER_S + 120)
    results.put(("ready", idx, {"watched_s": watched, "started_s": time.monotonic() - t0}))
    w_ready = counted.count

    rng = random.Random(seed + idx)
    go, stop = threading.Event(), threading.Event()
    fault_failures: list[int] = []
    bad_set = set(bad)
    bad_writers = [w for w in writers if w.node_name in bad_set]

    def agent_loop(w: NodeWriter) -> None:
        """What the agent loop does after its Marks turn failing, through its own WritePolicy: apply;
        retry a failed apply with backoff; while the brake holds the taint back, ask again."""
        go.wait()
        if spread_s > 0 and stop.wait(rng.uniform(0, spread_s)):
            return
        policy = WritePolicy(lambda: reask_s if reask_s is not None else brake_reask_s(cfg))
        marks = failing
        while not stop.is_set():
            res = w.apply(marks)
            marks = replace(failing, events=())  # as the agent: the engine's Events go out once
            if not res.ok:
                fault_failures.append(1)
            wait = policy.next_try(res)
            if wait is None:
                return
            stop.wait(wait)

    threads = [threading.Thread(target=agent_loop, args=(w,), daemon=True) for w in bad_writers]
    for t in threads:
        t.start()
    go_mp.wait()
    go.set()
    w_fault = counted.count
    stop_mp.wait()
    stop.set()
    for t in threads:
        t.join(5)
    results.put(
        (
            "done",
            idx,
            {
                "start_failures": len(start_failures),
                "fault_failures": len(fault_failures),
                "steady_warnings": w_fault - w_ready,
                "fault_warnings": counted.count - w_fault,
                "yields": counted.yields,
                "samples": counted.samples,
                "brake_open": sum(1 for w in bad_writers if w.brake_open),
                "vmhwm_kb": proc_rss_kb("self", "VmHWM"),
            },
        )
    )
    for w in writers:
        w.stop(timeout=0.05)


def collect(
    results: Any, kind: str, k: int, timeout: float, abort: threading.Event
) -> dict[int, dict[str, Any]]:
    """The shards' *kind* reports; returns early (incomplete) once *abort* is set."""
    import queue

    out: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    while len(out) < k:
        if abort.is_set():
            return out
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(out)} of {k} shards sent {kind!r} in {timeout:.0f} s")
        try:
            got, idx, payload = results.get(timeout=1.0)
        except queue.Empty:
            continue
        if got != kind:
            raise RuntimeError(f"shard {idx} sent {got!r}, expected {kind!r}")
        out[idx] = payload
    return out


@dataclass
class Run:
    """The arguments and what follows from them alone."""

    args: argparse.Namespace
    n: int
    k: int
    per_proc: int
    cfg: Config


@dataclass
class Fleet:
    """The running benchmark: the control plane, its monitors, the Nodes and the simulator processes."""

    run: Run
    env: Any
    guard: MemoryGuard
    trace: ApiserverTrace | None
    plane: dict[str, int]
    core: Any
    procs: list[Any]  # filled in place: the memory guard's callback kills what it holds
    names: list[str] = field(default_factory=list)
    bad: list[str] = field(default_factory=list)
    results: Any = None
    go_mp: Any = None
    stop_mp: Any = None
    meter: Any = None


@dataclass
class Figures:
    """What the phases measure, for the report."""

    created: float = 0.0
    started: float = 0.0
    ready: dict[int, dict[str, Any]] = field(default_factory=dict)
    done: dict[int, dict[str, Any]] = field(default_factory=dict)
    a_start: dict[tuple[str, str, str], float] = field(default_factory=dict)
    a1: dict[tuple[str, str, str], float] = field(default_factory=dict)
    start_reqs: dict[tuple[str, str, str], float] = field(default_factory=dict)
    steady: dict[tuple[str, str, str], float] = field(default_factory=dict)
    fault_reqs: dict[tuple[str, str, str], float] = field(default_factory=dict)
    lists: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    lat: dict[Any, float] = field(default_factory=dict)
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)  # Meter.mark() per phase
    changes: MarksWatch | None = None
    t_fault: float = 0.0
    stable_s: float = 0.0
    tainted: int = 0
    labelled_fail: int = 0
    labelled_tainted: int = 0


def parse_args() -> Run:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--processes", type=int, default=1, help="simulator processes sharing the identities")
    ap.add_argument("--steady-seconds", type=float, default=60.0)
    ap.add_argument("--fault-fraction", type=float, default=0.4)
    ap.add_argument(
        "--workers", type=int, default=32, help="concurrent applies (start and fault), all processes"
    )
    ap.add_argument("--observe-seconds", type=float, default=45.0, help="watch the fleet after the fault")
    ap.add_argument(
        "--reask-seconds", type=float, default=None, help="braked agents ask again (default: the agent's, 30)"
    )
    ap.add_argument(
        "--fault-spread-seconds",
        type=float,
        default=0.0,
        help="each failing agent sees the fault at a uniform random time in [0, S] after it happens "
        "(a periodic check notices within its interval; 0: all at the same moment)",
    )
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", type=Path, help="append the per-phase figures here as one JSON line")
    ap.add_argument("--label", default="", help="a name for this run in --json (e.g. the code measured)")
    ap.add_argument(
        "--agent-root",
        type=Path,
        help="run the simulated agents with the `agent` package of this checkout (the old code, beside "
        "this one's benchmark); default: this checkout's",
    )
    ap.add_argument("--trace", type=Path, help="append the API server's load metrics every 5 s here")
    ap.add_argument(
        "--heap-profile",
        type=Path,
        help="run kube-apiserver with --profiling and save its Go heap profile here when the memory "
        "guard trips or after the fault (read it with: go tool pprof -top -sample_index=inuse_space FILE)",
    )
    ap.add_argument(
        "--memory-floor-mib",
        type=int,
        default=1536,
        help="stop the run (and say so) when the machine's MemAvailable falls below this",
    )
    args = ap.parse_args()
    n, k = args.nodes, max(1, args.processes)
    per_proc = max(1, args.workers // k)

    healthy, failing = marks_of(HEALTHY), marks_of(XID79)
    assert not healthy.taint and failing.taint
    return Run(args, n, k, per_proc, load_config_dir())


def save_heap(args: argparse.Namespace, env: Any, tag: str) -> None:
    """With --heap-profile: the Go heap profiles of kube-apiserver and etcd, now."""
    if args.heap_profile is None:
        return
    import urllib.request

    with contextlib.suppress(Exception):
        rest = KubeRest.of(core_api(env))
        data = rest.request("GET", "/debug/pprof/heap", accept="*/*", timeout=(5, 60)).data
        args.heap_profile.write_bytes(data)
        print(f"fleet: kube-apiserver heap profile ({tag}) saved to {args.heap_profile}", flush=True)
    with contextlib.suppress(Exception):
        etcd_url = f"http://127.0.0.1:{env.plane.etcd_port}/debug/pprof/heap"
        etcd_file = args.heap_profile.with_name(args.heap_profile.stem + ".etcd" + args.heap_profile.suffix)
        with urllib.request.urlopen(etcd_url, timeout=60) as resp:
            etcd_file.write_bytes(resp.read())
        print(f"fleet: etcd heap profile ({tag}) saved to {etcd_file}", flush=True)


def kill_simulators(args: argparse.Namespace, env: Any, procs: list[Any]) -> None:
    """The memory guard's trip: save the heap profiles, then kill the simulator processes."""
    save_heap(args, env, "memory guard")
    for p in procs:
        with contextlib.suppress(Exception):
            p.kill()


def check_memory(fleet: Fleet, phase: str) -> None:
    if fleet.guard.tripped.is_set():
        raise SystemExit(
            f"fleet: STOPPED during {phase}: MemAvailable fell below {fleet.run.args.memory_floor_mib} MiB "
            f"(simulators killed). {fleet.guard.report()}"
        )


def start_control_plane(run: Run, env: Any) -> Fleet:
    """The memory guard (and --trace) on the running kube-apiserver and etcd."""
    procs: list[Any] = []
    guard = MemoryGuard(run.args.memory_floor_mib, lambda: kill_simulators(run.args, env, procs))
    plane = {"kube-apiserver": env.plane.apiserver.pid, "etcd": env.plane.etcd.pid}
    for name, pid in plane.items():
        guard.watch(name, pid)
    guard.start()
    trace = ApiserverTrace(env, run.args.trace, plane).start() if run.args.trace else None
    return Fleet(run, env, guard, trace, plane, core_api(env, pool=64), procs)


def create_nodes(fleet: Fleet, figs: Figures) -> None:
    """Phase 1a: the N Nodes; then the faulty ones are picked."""
    run = fleet.run
    fleet.names = [f"gpu-{i:05d}" for i in range(run.n)]
    t0 = time.monotonic()
    with ThreadPoolExecutor(run.args.workers) as ex:
        list(ex.map(lambda name: create_node(fleet.core, name), fleet.names))
    figs.created = time.monotonic() - t0
    agent_daemonset(fleet.env, run.n)  # the brake's GPU-node total, as the DaemonSet controller keeps it

    rng = random.Random(run.args.seed)
    fleet.bad = rng.sample(fleet.names, round(run.n * run.args.fault_fraction))


def use_agent_root(root: Path | None) -> None:
    """With --agent-root: the simulator processes (spawned: they take this process's sys.path)
    import `agent` from a copy of that checkout's package, and `bench` from this one."""
    if root is None:
        return
    import shutil
    import sys
    import tempfile

    dest = Path(tempfile.mkdtemp(prefix="fleet-agent-"))
    shutil.copytree(root / "agent", dest / "agent", symlinks=True)
    shutil.copytree(root / "config", dest / "config")  # agent/config/defaults links to it
    sys.path.insert(0, str(dest))
    print(f"fleet: the simulated agents run the agent package of {root}", flush=True)


def start_simulators(fleet: Fleet, figs: Figures) -> None:
    """Phase 1b: the K simulator processes, until each reports "ready" (first marks on all its Nodes)."""
    run, args, k, names = fleet.run, fleet.run.args, fleet.run.k, fleet.names
    mp = multiprocessing.get_context("spawn")
    use_agent_root(args.agent_root)
    fleet.results, fleet.go_mp, fleet.stop_mp = mp.Queue(), mp.Event(), mp.Event()
    figs.a_start = apiserver_requests(fleet.env)
    fleet.meter = Meter(fleet.env, fleet.plane["kube-apiserver"], fleet.guard)
    t0 = time.monotonic()
    fleet.procs[:] = [
        mp.Process(
            target=shard,
            args=(
                i,
                str(fleet.env.kubeconfig),
                names[i::k],
                [b for b in fleet.bad if b in set(names[i::k])],
                run.per_proc,
                args.reask_seconds,
                args.fault_spread_seconds,
                args.seed,
                fleet.results,
                fleet.go_mp,
                fleet.stop_mp,
            ),
            daemon=True,
        )
        for i in range(k)
    ]
    for p in fleet.procs:
        p.start()
        fleet.guard.watch("simulators", p.pid)
    figs.ready = collect(fleet.results, "ready", k, timeout=3600, abort=fleet.guard.tripped)
    check_memory(fleet, "the start")
    figs.started = time.monotonic() - t0
    time.sleep(3)  # the watches of the last writes arrive
    figs.phases["start-up"] = fleet.meter.mark()


def steady_window(fleet: Fleet, figs: Figures) -> None:
    """Phase 2: --steady-seconds in which nothing changes; the requests in it (and in the start)."""
    a0 = apiserver_requests(fleet.env)
    time.sleep(fleet.run.args.steady_seconds)
    figs.phases["steady"] = fleet.meter.mark()
    figs.a1 = apiserver_requests(fleet.env)
    figs.steady = diff(figs.a1, a0)
    figs.start_reqs = diff(a0, figs.a_start)


def fault_window(fleet: Fleet, figs: Figures) -> None:
    """Phase 3: the fault, then --observe-seconds (cut short by the memory guard); the load in it."""
    env, args = fleet.env, fleet.run.args
    figs.changes = MarksWatch(fleet.core)
    time.sleep(1.5)  # every shard's agent threads are waiting for the go
    lists0 = node_list_sources(env)
    cpu_pids = {**fleet.plane, **{f"simulator {i}": p.pid for i, p in enumerate(fleet.procs)}}
    cpu0 = {name: proc_cpu_s(pid) for name, pid in cpu_pids.items()}
    lat0 = request_latency_buckets(env)
    fleet.meter.mark()  # (the observer's own list of all Nodes is not the agents')
    figs.t_fault = time.perf_counter()
    fleet.go_mp.set()
    fleet.guard.tripped.wait(args.observe_seconds)
    check_memory(fleet, "the fault")
    figs.phases["wave"] = fleet.meter.mark()
    a2 = apiserver_requests(env)
    save_heap(args, env, "end of the fault window")
    lists1 = node_list_sources(env)
    figs.lists = {key: lists1[key] - lists0[key] for key in lists0}
    figs.cpu = {name: proc_cpu_s(pid) - cpu0[name] for name, pid in cpu_pids.items()}
    lat1 = request_latency_buckets(env)
    figs.lat = {key: lat1[key] - lat0.get(key, 0.0) for key in lat1}
    figs.fault_reqs = diff(a2, figs.a1)


def stop_simulators(fleet: Fleet, figs: Figures) -> None:
    """The simulators' "done" reports; when the fleet's marks last changed; the Nodes' final state."""
    assert figs.changes is not None
    fleet.stop_mp.set()
    figs.done = collect(fleet.results, "done", fleet.run.k, timeout=120, abort=fleet.guard.tripped)
    check_memory(fleet, "the end of the fault")
    for p in fleet.procs:
        p.join(30)
    figs.changes.stop()
    last_change = figs.changes.last_change
    figs.stable_s = last_change - figs.t_fault if last_change > figs.t_fault else 0.0

    figs.tainted = tainted_nodes(fleet.core)
    figs.labelled_fail = count_nodes(fleet.core, "gpu-healthcheck/status=fail")
    figs.labelled_tainted = count_nodes(fleet.core, "gpu-healthcheck/tainted=true")


def stop_monitors(fleet: Fleet) -> None:
    """After a complete run (the control plane itself goes with kube_env, on every path)."""
    fleet.guard.stop()
    if fleet.trace is not None:
        fleet.trace.stop()


def print_start_and_steady(fleet: Fleet, figs: Figures) -> None:
    run, args, n, k, bad = fleet.run, fleet.run.args, fleet.run.n, fleet.run.k, fleet.bad
    done = figs.done
    start_failures = sum(int(d["start_failures"]) for d in done.values())
    steady_warnings = sum(int(d["steady_warnings"]) for d in done.values())
    frac = run.cfg.node.max_tainted_fraction
    hours = args.steady_seconds / 3600
    print(f"fleet  machine: {machine()}  apiserver: {fleet.env.version}")
    print(
        f"parameters: nodes={n} ({k} simulator process{'es' if k > 1 else ''}, each with its own ApiClient: "
        f"{n} NodeWriter+Brake, {n} watches in all) fault on {len(bad)} nodes ({args.fault_fraction:.0%}) "
        f"workers={args.workers} "
        f"maxTaintedFraction={frac}"
    )
    print(
        f"start: {n} Nodes created in {figs.created:.1f} s; first marks on all in {figs.started:.1f} s; ",
        end="",
    )
    print(f"requests {sum(figs.start_reqs.values()):.0f}, failed applies {start_failures}")
    watched = max(d["watched_s"] for d in figs.ready.values())
    peak = ", ".join(f"{d['vmhwm_kb'] / 1024:.0f}" for _i, d in sorted(done.items()))
    print(
        f"  (all watches open after {watched:.1f} s in the slowest process; peak RSS per process MiB: {peak})"
    )
    print(f"steady state ({args.steady_seconds:.0f} s):")
    print(f"  {'resource':<14} {'verb':<8} {'in window':>9} {'per node-hour':>14}")
    if not figs.steady:
        print(f"  {'nodes/events':<14} {'(any)':<8} {0:>9} {0:>14.2f}")
    for (res, verb), cnt in sorted(by_verb(figs.steady).items()):
        print(f"  {res:<14} {verb:<8} {cnt:>9.0f} {cnt / n / hours:>14.2f}")
    total_rate = sum(figs.steady.values()) / args.steady_seconds
    print(f"  total {total_rate:.3f} requests/s for the fleet; writer warnings {steady_warnings}")


def print_fault(fleet: Fleet, figs: Figures) -> None:
    run, args, n, k = fleet.run, fleet.run.args, fleet.run.n, fleet.run.k
    changes = figs.changes
    assert changes is not None

    def total(key: str) -> int:
        return sum(int(d[key]) for d in figs.done.values())

    start_failures, fault_failures = total("start_failures"), total("fault_failures")
    fault_warnings, yields = total("fault_warnings"), total("yields")
    brake_open = total("brake_open")
    samples = [s for d in figs.done.values() for s in d["samples"]][:5]
    frac = run.cfg.node.max_tainted_fraction
    limit = math.ceil(frac * n)  # refuse when tainted_now >= frac * n: at most ceil(frac * n) taints
    stable_s, lists, cpu = figs.stable_s, figs.lists, figs.cpu
    tainted, labelled_fail, labelled_tainted = figs.tainted, figs.labelled_fail, figs.labelled_tainted
    t_fault = figs.t_fault
    quiet_from = t_fault + stable_s
    spread = (
        f", seen by each agent within {args.fault_spread_seconds:g} s"
        if args.fault_spread_seconds
        else ", seen by all at once"
    )
    print(f"fault on {len(fleet.bad)} nodes{spread}:")
    print(f"  time until the fleet's marks are stable (last change of our keys): {stable_s:.2f} s")
    print(
        f"  tainted {tainted} (label tainted=true: {labelled_tainted}); brake limit {limit} "
        f"(ceil({frac} x {n})); labelled fail {labelled_fail}; writers holding back (brake open) {brake_open}"
    )
    print(f"  most nodes tainted at one time (seen by a watch of all Nodes): {changes.peak_tainted}")
    print(f"  requests in the {args.observe_seconds:.0f} s from the fault (braked agents re-ask meanwhile):")
    print(f"  {'resource':<14} {'verb':<8} {'requests':>9}")
    for (res, verb), cnt in sorted(by_verb(figs.fault_reqs).items()):
        print(f"  {res:<14} {verb:<8} {cnt:>9.0f}")
    errs = {**errors_of(figs.fault_reqs), **errors_of(figs.steady), **errors_of(figs.start_reqs)}
    print(
        f"  API errors: non-2xx at the server {sum(errs.values()):.0f} {errs or ''}; failed applies "
        f"{fault_failures + start_failures}; writer warnings {fault_warnings} "
        f"(of which 'yielding' after the post-taint re-count: {yields})"
        + (f" e.g. {samples}" if samples else "")
    )
    print(
        f"  Node LISTs served from the watch cache {lists['cache']:.0f}, from etcd {lists['etcd']:.0f} "
        f"({lists['etcd_objects']:.0f} objects read from etcd); CPU seconds in the window: "
        f"kube-apiserver {cpu['kube-apiserver']:.1f}, etcd {cpu['etcd']:.1f}, the {k} simulator processes "
        f"{sum(v for name, v in cpu.items() if name.startswith('simulator')):.1f} "
        f"(the machine: {os.cpu_count()} cores x {args.observe_seconds:.0f} s)"
    )
    for verb in ("PATCH", "LIST"):
        p50, count = bucket_quantile(figs.lat, verb, 0.5)
        p99, _ = bucket_quantile(figs.lat, verb, 0.99)
        if count:
            print(
                f"  server-side latency of Node {verb} (apiserver_request_duration_seconds, bucket bounds): "
                f"p50 <= {p50:g} s, p99 <= {p99:g} s over {count:.0f}"
            )
    print(f"  memory over the whole run: {fleet.guard.report()}")
    print(
        f"  marks changes seen by a watch of all Nodes: {changes.changes} (watch re-opened after a "
        f"server close: {changes.restarts}x); the last one "
        f"{stable_s:.2f} s after the fault, then none for {t_fault + args.observe_seconds - quiet_from:.0f} s"
    )


def main() -> None:
    run = parse_args()
    profiling = run.args.heap_profile is not None
    figs = Figures()
    with kube_env(
        ["--profiling=true"] if profiling else None, ["--enable-pprof"] if profiling else None
    ) as env:
        fleet = start_control_plane(run, env)
        create_nodes(fleet, figs)
        start_simulators(fleet, figs)
        steady_window(fleet, figs)
        fault_window(fleet, figs)
        stop_simulators(fleet, figs)
        stop_monitors(fleet)
    print_start_and_steady(fleet, figs)
    print_fault(fleet, figs)
    print_phases(fleet, figs)


def phase_doc(phase: dict[str, Any]) -> dict[str, Any]:
    """A Meter phase as JSON."""
    served = phase["served"]
    return {
        "seconds": round(phase["seconds"], 1),
        "requests": sum(r for (_, verb), (r, _) in served.items() if verb != "WATCH"),
        "bytes": sum(b for (_, verb), (_, b) in served.items() if verb != "WATCH"),
        "watches": sum(r for (_, verb), (r, _) in served.items() if verb == "WATCH"),
        "watch_bytes": sum(phase["watch_bytes"].values()),
        "cpu_s": round(phase["cpu_s"], 2),
        "peak_rss_mib": round(phase["peak_rss_kb"] / 1024, 1),
        "by_verb": {f"{res} {verb}": [r, b] for (res, verb), (r, b) in sorted(served.items())},
    }


def print_phases(fleet: Fleet, figs: Figures) -> None:
    """The fleet-cost figures: per phase what the API server served (requests, bytes; its own /metrics),
    per agent and per failing node, and its CPU and peak RSS per 1,000 agents."""
    n, failing = fleet.run.n, len(fleet.bad)
    print("per phase, as the API server counted it (nodes, events, leases, daemonsets; watch streams apart):")
    for name, phase in figs.phases.items():
        for line in phase_lines(name, phase, n, failing if name == "wave" else 0):
            print(f"  {line}")
    args = fleet.run.args
    if args.json:
        doc = {
            "label": args.label,
            "nodes": n,
            "failing": failing,
            "load": os.getloadavg(),
            "spread_s": args.fault_spread_seconds,
            "peak_tainted": figs.changes.peak_tainted if figs.changes else None,
            "tainted": figs.tainted,
            "limit": math.ceil(fleet.run.cfg.node.max_tainted_fraction * n),
            "errors": {
                k: sum(d.get(k, 0) for d in errors)
                for errors in [
                    [errors_of(figs.start_reqs), errors_of(figs.steady), errors_of(figs.fault_reqs)]
                ]
                for k in set().union(*errors)
            },
            "stable_s": round(figs.stable_s, 1),
            "started_s": round(figs.started, 1),
            "phases": {name: phase_doc(p) for name, p in figs.phases.items()},
        }
        with args.json.open("a") as f:
            f.write(json.dumps(doc) + "\n")


if __name__ == "__main__":
    main()
