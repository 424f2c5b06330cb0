"""The repair budget and the wave hold against a repair engine: a persistent false positive on a fleet.

Usage: python -m bench.repair_budget [--nodes 2000] [--processes 4] [--hours 4] [--speed 60]

What runs: one real API server; N GPU Nodes; for every node that has (or will have) the fault, the
agent's real Node-side code (NodeWriter with its own Brake and RepairBudget; the shipped config plus
one remediation condition, AcceleratedHardwareReady; the Marks a real Engine computes from the Xid 79
snapshot, finding key xid/79), started before the fault (watch, the fleet's GPU-node total), spread
over --processes simulator processes with an API client each; a simulated repair engine (Karpenter's
shape): a node whose AcceleratedHardwareReady has been False for the toleration is deleted and a new
node joins with the same fault (a bad driver in the node image: persistent). Healthy nodes run no
agent (a healthy agent makes no request).

The fault: a bad node image reaches the first --fault-fraction of the fleet at --rollout-per-min nodes
per simulated minute. At --release-at hours an operator runs `gpu-healthcheck brake release` (all
keys): the wave hold ends and the budget alone paces the marks (until replacements, which carry the
same fault, make a wave again).

Time is compressed by --speed (60: one simulated hour is 60 s): the budget's window (60 min), the
wave's (15 min) and the toleration (10 min) are divided by it. The agents ask again every 2 s real
(their own re-ask is 30 s), their hold cache the same. Printed per simulated hour: nodes newly
failing, marked (the engine first saw AcceleratedHardwareReady=False), replaced, held at the end of
the hour (by the wave, by the budget); the most marks the agents decided (for each node the engine
saw marked, its last mark record: server time) in any window of the budget, before and after the
release; when the wave engaged (the threshold-th node's fail record
after the first) and when the engine first saw a WaveHeld condition. Exits 1 when a window's marks
exceed the budget's limit, or the wave engaged later than its window after the first failure, or
never showed.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from agent.config import load_config_dir
from agent.core.marks import Marks
from agent.core.record_kind import RecordKind
from agent.core.remediation_types import RemediationReason
from agent.core.repair_budget import budget_limit, wave_threshold
from agent.engine.engine import Engine
from agent.engine.write_policy import WritePolicy
from agent.probes.snapshot import SnapshotSource
from agent.reporters.brake import Brake
from agent.reporters.budget_records import list_records
from agent.reporters.kube_rest import KubeRest
from agent.reporters.node_writer import NodeWriter
from agent.reporters.repair_budget import RepairBudget
from bench._kube import (
    XID79,
    MemoryGuard,
    Meter,
    agent_daemonset,
    apiserver_requests,
    core_api,
    diff,
    kube_env,
    machine,
    phase_lines,
)
from bench.fleet import create_node, phase_doc, use_agent_root

AHR = "AcceleratedHardwareReady"
NS = "gpu-healthcheck"
R = RemediationReason
REASK_S = 2.0


def config_dir(dest: Path, speed: float) -> Path:
    """config.yaml with one remediation condition and the windows divided by *speed*."""
    text = (Path(__file__).parent.parent / "config" / "config.yaml").read_text()
    entry = (
        f'  remediationConditions:\n    - type: {AHR}\n      unhealthyStatus: "False"\n'
        "      minSeverity: reset\n"
    )
    text = text.replace("  remediationConditions: []\n", entry)
    text = text.replace("    windowMinutes: 60 ", f"    windowMinutes: {60 / speed:g} ")
    text = text.replace("    windowMinutes: 15 ", f"    windowMinutes: {15 / speed:g} ")
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.yaml").write_text(text)
    return dest


def failing_marks(cfg_dir: Path) -> Marks:
    engine = Engine(SnapshotSource(XID79), load_config_dir(cfg_dir))
    for tier in ("gpu", "xid", "efa", "topology"):
        engine.run_tier(tier)
    return engine.evaluate()[1]


def shard(kubeconfig: str, cfg_dir: str, commands: Any, ready: Any, stop_mp: Any) -> None:
    """One simulator process: an agent for each node it is told to start (its watch and the brake's
    GPU-node total read, as the agent does at start), failing from when it is told the fault is there."""
    from kubernetes import config as kconfig
    from kubernetes.client import CoreV1Api

    threading.stack_size(512 * 1024)
    logging.getLogger("agent.reporters").setLevel(logging.ERROR)
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    cfg = load_config_dir(Path(cfg_dir))
    marks = failing_marks(Path(cfg_dir))
    api = kconfig.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    api.configuration.connection_pool_maxsize = 512
    api.rest_client.pool_manager.connection_pool_kw["maxsize"] = 512
    core: Any = CoreV1Api(api)
    stops: dict[str, threading.Event] = {}
    faults: dict[str, threading.Event] = {}

    def agent(name: str, fault: threading.Event, stop: threading.Event) -> None:
        brake = Brake(
            core,
            cfg=cfg,
            node_name=name,
        )
        repair = RepairBudget(
            core,
            name,
            namespace=NS,
            brake=brake,
            cfg=cfg,
            hold_cache_s=REASK_S,
        )
        writer = NodeWriter(core, name, brake=brake, repair=repair, cfg=cfg)
        writer.start()
        if hasattr(brake, "warm"):
            brake.gpu_node_names()  # the old agent read the fleet's total at start (brake.warm)
        ready.put(name)
        while not fault.wait(0.5):
            if stop.is_set() or stop_mp.is_set():
                return
        policy = WritePolicy(lambda: REASK_S)
        m = marks
        while not stop.is_set() and not stop_mp.is_set():
            res = writer.apply(m)
            m = replace(marks, events=())
            wait = policy.next_try(res)
            stop.wait(wait if wait is not None else REASK_S * 5)  # a marked node: nothing to do
        writer.stop(0.05)

    while not stop_mp.is_set():
        try:
            verb, name = commands.get(timeout=0.5)
        except queue.Empty:
            continue
        if verb == "start":
            stops[name], faults[name] = threading.Event(), threading.Event()
            threading.Thread(target=agent, args=(name, faults[name], stops[name]), daemon=True).start()
        elif verb == "fail" and name in faults:
            faults[name].set()
        elif verb == "gone" and name in stops:
            stops.pop(name).set()


class CountedRest(KubeRest):
    """The observer's own requests and response bytes (it is no agent: the report takes them out)."""

    requests = 0
    bytes = 0

    def json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        resp = self.request(method, path, **kwargs)
        try:
            raw = resp.data
        finally:
            resp.release_conn()
        CountedRest.requests += 1
        CountedRest.bytes += len(raw or b"")
        import json

        return json.loads(raw) if raw else {}


class Engineer:
    """The simulated repair engine and the observer: polls the failing Nodes."""

    def __init__(self, core: Any, toleration_s: float, replace_node: Any) -> None:
        self.core, self.toleration_s, self.replace_node = core, toleration_s, replace_node
        self.false_since: dict[str, float] = {}  # nodes marked and not replaced yet
        self.seen: set[str] = set()
        self.marked_at: list[float] = []  # when each node was first seen with AHR=False
        self.replaced_at: list[float] = []
        self.held: dict[str, str] = {}  # node -> reason, as last seen
        self.wave_seen: float | None = None
        self.records: dict[str, Any] = {}  # name -> Record, every record seen (server times)
        self.stop = threading.Event()

    def poll(self) -> None:
        rest = CountedRest(self.core.api_client)
        for rec in list_records(rest, NS, "gpu-healthcheck"):
            self.records.setdefault(rec.name, rec)
        doc = rest.json("GET", "/api/v1/nodes", query={"labelSelector": "gpu-healthcheck/status=fail"})
        now = time.monotonic()
        held = {}
        for node in doc.get("items") or ():
            name = node["metadata"]["name"]
            cond = next((c for c in node["status"].get("conditions") or () if c["type"] == AHR), None)
            if cond is None:
                continue
            if cond["reason"] in (R.WAVE_HELD, R.BUDGET_HELD):
                held[name] = cond["reason"]
                if cond["reason"] == R.WAVE_HELD and self.wave_seen is None:
                    self.wave_seen = now
            if cond["status"] == "False" and name not in self.seen:
                self.seen.add(name)
                self.false_since[name] = now
                self.marked_at.append(now)
        self.held = held
        for name, since in list(self.false_since.items()):
            if now - since >= self.toleration_s:
                del self.false_since[name]
                self.replaced_at.append(now)
                self.replace_node(name)

    def run(self, period: float) -> None:
        while not self.stop.wait(period):
            try:
                self.poll()
            except Exception as exc:  # a slow answer: the next poll
                logging.warning("engine poll failed: %s", exc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--hours", type=float, default=4.0, help="simulated hours")
    ap.add_argument("--speed", type=float, default=60.0, help="simulated seconds per real second")
    ap.add_argument(
        "--fault-fraction", type=float, default=0.2, help="share of the fleet the bad image reaches"
    )
    ap.add_argument("--rollout-per-min", type=float, default=20.0, help="nodes per simulated minute")
    ap.add_argument(
        "--release-at", type=float, default=1.5, help="simulated hour of `brake release` (<0: never)"
    )
    ap.add_argument("--toleration-min", type=float, default=10.0, help="the engine's wait, simulated minutes")
    ap.add_argument("--json", type=Path, help="append the per-phase figures here as one JSON line")
    ap.add_argument("--label", default="", help="a name for this run in --json (e.g. the code measured)")
    ap.add_argument("--agent-root", type=Path, help="run the simulated agents with this checkout's `agent`")
    args = ap.parse_args()
    speed = args.speed
    hour = 3600 / speed
    print(f"machine: {machine()}")
    with kube_env() as env:
        import tempfile

        tmp = Path(tempfile.mkdtemp(prefix="repair-budget-"))
        cfg_dir = config_dir(tmp / "config", speed)
        cfg = load_config_dir(cfg_dir)
        core = core_api(env, pool=64)
        env.ensure_namespace(NS)
        names = [f"gpu-{i:05d}" for i in range(args.nodes)]
        with ThreadPoolExecutor(32) as ex:
            list(ex.map(lambda n: create_node(core, n), names))
        agent_daemonset(env, args.nodes)  # the brake's total, as the DaemonSet controller keeps it
        guard = MemoryGuard(512, lambda: None)
        guard.watch("kube-apiserver", env.plane.apiserver.pid)
        guard.start()
        meter = Meter(env, env.plane.apiserver.pid, guard)
        phases: dict[str, Any] = {}
        limit = budget_limit(cfg.node.repair_budget, args.nodes)
        need = wave_threshold(cfg.node.wave_hold, args.nodes)
        per = cfg.node.repair_budget.window_s * speed / 60
        within = cfg.node.wave_hold.window_s * speed / 60
        print(
            f"{args.nodes} GPU nodes; budget {limit} new marks per {per:g} min; wave hold at {need} nodes "
            f"on one key within {within:g} min; time x{speed:g} (1 h = {hour:g} s)"
        )
        mp = multiprocessing.get_context("spawn")
        use_agent_root(args.agent_root)
        stop_mp = mp.Event()
        queues = [mp.Queue() for _ in range(args.processes)]
        ready = mp.Queue()
        procs = [
            mp.Process(target=shard, args=(str(env.kubeconfig), str(cfg_dir), q, ready, stop_mp), daemon=True)
            for q in queues
        ]
        for p in procs:
            p.start()
        bad = names[: round(args.nodes * args.fault_fraction)]
        t_start = time.monotonic()
        for name in bad:  # their agents run before the fault: watch started, the fleet's total read
            queues[hash(name) % len(queues)].put(("start", name))
        for _ in bad:
            ready.get(timeout=600)
        print(f"{len(bad)} agents started (watch, GPU-node total) in {time.monotonic() - t_start:.0f} s")
        phases["start-up"] = meter.mark()
        counter = [0]
        lock = threading.Lock()
        fails: list[float] = []

        def fail(name: str) -> None:
            with lock:
                fails.append(time.monotonic())
                queues[hash(name) % len(queues)].put(("fail", name))

        def replace_node(name: str) -> None:
            queues[hash(name) % len(queues)].put(("gone", name))
            try:
                core.delete_node(name)
            except Exception as exc:
                logging.warning("delete %s: %s", name, exc)
            with lock:
                counter[0] += 1
                new = f"gpu-r{counter[0]:05d}"
            create_node(core, new)
            queues[hash(new) % len(queues)].put(("start", new))
            fail(new)  # the replacement has the same fault

        engine = Engineer(core, args.toleration_min * 60 / speed, replace_node)
        before = apiserver_requests(env, ("leases", "nodes"))
        t0 = time.monotonic()
        threading.Thread(target=engine.run, args=(0.5,), daemon=True).start()
        gap = 60 / speed / args.rollout_per_min
        released = args.release_at < 0
        rows: list[tuple[int, ...]] = []
        next_row = t0 + hour
        i = 0
        while len(rows) < round(args.hours):
            now = time.monotonic()
            while i < len(bad) and now - t0 >= i * gap:
                fail(bad[i])
                i += 1
            if not released and now - t0 >= args.release_at * hour:
                from agent.cli.brake import release

                why = "bench: the operator decides the failures are genuine"
                said = release(
                    KubeRest.of(core), namespace=NS, prefix="gpu-healthcheck", key="", reason=why, who="bench"
                )
                print(f"  {(time.monotonic() - t0) / hour:.2f} h: {said}")
                released = True
            if now >= next_row:
                h = len(rows)
                lo, hi = t0 + h * hour, t0 + (h + 1) * hour
                held = list(engine.held.values())
                seen = (fails, engine.marked_at, engine.replaced_at)
                counts = tuple(sum(lo <= t < hi for t in ts) for ts in seen)
                rows.append((h + 1, *counts, held.count(R.WAVE_HELD), held.count(R.BUDGET_HELD)))
                next_row += hour
            time.sleep(0.05)
        phases["wave"] = meter.mark()
        # the observer's (the simulated repair engine's) polls are not the agents': taken out
        wave = phases["wave"]
        wave["served"][("observer (taken out)", "")] = (-CountedRest.requests, -CountedRest.bytes)
        guard.stop()
        engine.stop.set()
        stop_mp.set()
        for p in procs:
            p.join(10)
        reqs = diff(apiserver_requests(env, ("leases", "nodes")), before)

    window, wave_s = cfg.node.repair_budget.window_s, cfg.node.wave_hold.window_s
    recs = list(engine.records.values())
    rel = min((r.rv for r in recs if r.kind == RecordKind.RELEASE), default=10**18)
    # The mark the agents decided for each node the engine saw marked: its last mark record (a marked
    # node asks no more; a loser's records, taken back, may live seconds on a loaded server).
    last: dict[str, Any] = {}
    for r in sorted((r for r in recs if r.kind == RecordKind.MARK), key=lambda r: r.rv):
        last[r.node] = r
    decided = [r for node, r in last.items() if node in engine.seen]
    most = 0
    for segment in ([r for r in decided if r.rv < rel], [r for r in decided if r.rv > rel]):
        times = sorted(r.at for r in segment)
        most = max([most, *(sum(t <= u < t + window for u in times) for t in times)])
    print(f"{'hour':>4} {'newly failing':>13} {'marked':>6} {'replaced':>8} {'held: wave':>10} {'budget':>6}")
    for row in rows:
        print(f"{row[0]:>4} {row[1]:>13} {row[2]:>6} {row[3]:>8} {row[4]:>10} {row[5]:>6}")
    print(
        f"marks decided (the budget's records, server time) in any {window * speed / 60:g}-min window "
        f"before and after the release: at most {most} (budget {limit})"
    )
    first_fails: dict[str, float] = {}
    for r in sorted((r for r in recs if r.kind == RecordKind.FAIL and r.rv < rel), key=lambda r: r.rv):
        first_fails.setdefault(r.node, r.at)
    times = sorted(first_fails.values())
    engaged = (times[need - 1] - times[0]) * speed / 60 if len(times) >= need else None
    seen = (engine.wave_seen - fails[0]) * speed / 60 if engine.wave_seen and fails else None
    print(
        f"wave hold engaged (the {need}th node failing on xid/79, server time) "
        + (f"{engaged:.1f} min after the first failure" if engaged is not None else "never")
        + f" (window {wave_s * speed / 60:g} min); first WaveHeld condition seen "
        + (f"{seen:.1f} min after the first fault" if seen is not None else "never")
    )
    lease = {k: v for k, v in reqs.items() if k[0] == "leases"}
    by_verb: dict[str, float] = {}
    for (_, verb, code), v in lease.items():
        by_verb[f"{verb} {code}"] = by_verb.get(f"{verb} {code}", 0) + v
    print("lease requests: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(by_verb.items())))
    print(
        "per phase, as the API server counted it (nodes, events, leases, daemonsets; the engine's polls "
        "taken out):"
    )
    for name, phase in phases.items():
        for line in phase_lines(name, phase, len(bad), len(bad) if name == "wave" else 0):
            print(f"  {line}")
    if args.json:
        import json
        import os

        doc = {
            "bench": "repair_budget",
            "label": args.label,
            "nodes": args.nodes,
            "agents": len(bad),
            "load": os.getloadavg(),
            "most_marks": most,
            "limit": limit,
            "engaged_min": engaged,
            "phases": {name: phase_doc(p) for name, p in phases.items()},
        }
        with args.json.open("a") as f:
            f.write(json.dumps(doc) + "\n")
    ok = most <= limit and engaged is not None and engaged <= wave_s * speed / 60 and seen is not None
    print("PASS" if ok else "FAIL")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
