"""Footprint: agent RSS after warm-up and CPU time per cycle on an 8-GPU snapshot.

Usage: python -m bench.footprint [--cycles 30] [--interval 2] [--runs 30] [--profile] [--no-process]

Two measurements:
1. In-process (like bench/check_cpu.py): an Engine on the healthy p5.48xlarge snapshot (8 GPUs,
   1650-line nvidia-smi -q, 2400-line kmsg.log, 32 EFA devices in sysfs); CPU time (process_time) of
   each tier's run_tier, and of evaluate() + fingerprint (what the loop does after a tier), over
   --runs runs after one warm-up. "cycle, every tier" = all four tiers + evaluate; "cycle, default
   mix" = gpu + xid + evaluate every cycle, efa and topology every 5th (intervals 60/300/300 s).
2. The agent process against a real etcd + kube-apiserver: every tier on --interval seconds (so each
   cycle runs all tiers), metrics port on. RSS (VmRSS, VmHWM from /proc/PID/status) after the first
   verdict and a warm-up; then the process's user+sys CPU (/proc/PID/stat) over --cycles gpu-tier
   cycles, divided by the cycles. This includes everything the process does meanwhile: the kernel-log
   follower's 50 ms polls, the config poll, the Node watch, and a few /metrics scrapes (cycles are
   counted from `gpu_healthcheck_tier_duration_seconds_count`, read at the start, after --cycles
   intervals, then once per interval until enough have run).
--profile prints the top functions (cProfile, cumulative) of the in-process cycles.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import tempfile
import time
from pathlib import Path

from agent.config import load_config_dir
from agent.core.contract import Keys
from agent.engine.engine import Engine, fingerprint
from agent.probes.snapshot import SnapshotSource
from bench._kube import (
    HEALTHY,
    AgentProcess,
    core_api,
    free_port,
    kube_env,
    machine,
    metric_sum,
    pct,
    proc_cpu_s,
    proc_rss_kb,
    snapshot_copy,
    wait_for,
    write_config,
)

TIERS = ("gpu", "xid", "efa", "topology")


def in_process(runs: int, profile: bool) -> None:
    engine = Engine(SnapshotSource(HEALTHY), load_config_dir())
    times: dict[str, list[float]] = {t: [] for t in (*TIERS, "evaluate")}
    prof = cProfile.Profile() if profile else None
    for i in range(runs + 1):
        for tier in TIERS:
            t0 = time.process_time()
            if prof and i:
                prof.enable()
            engine.run_tier(tier)
            if prof and i:
                prof.disable()
            if i:
                times[tier].append((time.process_time() - t0) * 1000)
        t0 = time.process_time()
        _, marks = engine.evaluate()
        fingerprint(marks)
        if i:
            times["evaluate"].append((time.process_time() - t0) * 1000)
    med = {k: statistics.median(v) for k, v in times.items()}
    every = [sum(times[k][i] for k in times) for i in range(runs)]
    default = med["gpu"] + med["xid"] + med["evaluate"] + (med["efa"] + med["topology"]) / 5
    print(f"in-process: Engine on {HEALTHY.name}, {runs} runs after one warm-up (CPU ms, process_time)")
    print(f"{'step':<24} {'median':>8} {'p95':>8} {'max':>8}")
    for k, v in times.items():
        label = f"run_tier({k})" if k in TIERS else "evaluate+fingerprint"
        print(f"{label:<24} {statistics.median(v):>8.1f} {pct(v, 0.95):>8.1f} {max(v):>8.1f}")
    med_every, p95_every = statistics.median(every), pct(every, 0.95)
    print(f"{'cycle, every tier':<24} {med_every:>8.1f} {p95_every:>8.1f} {max(every):>8.1f}")
    print(f"{'cycle, default mix':<24} {default:>8.1f}")
    if prof is not None:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(25)
        print(out.getvalue())


def rss_kib(pid: int) -> tuple[int, int]:
    return proc_rss_kb(pid), proc_rss_kb(pid, "VmHWM")


def process(cycles: int, interval: float, warmup: float) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-foot-") as tmp, kube_env() as env:
        work = Path(tmp)
        node = "bench-footprint-node"
        env.make_gpu_node(node, instance_type="p5.48xlarge", gpus=8)
        snap = snapshot_copy(work / "snap")
        cfg = write_config(
            work / "config",
            f"intervals:\n  gpu: {interval:g}\n  efa: {interval:g}\n  topology: {interval:g}\n"
            "jitterFraction: 0\n",
        )
        port = free_port()
        agent = AgentProcess(env, node, snap, cfg, work / "agent.log", metrics_port=port)
        core = core_api(env)
        try:
            wait_for(
                lambda: (core.read_node(node).metadata.labels or {}).get(Keys().status) == "pass",
                60,
                "first verdict",
            )
            time.sleep(warmup)
            rss, hwm = rss_kib(agent.pid)
            gpu_runs = "gpu_healthcheck_tier_duration_seconds_count{tier=gpu"
            c0, n0, w0 = proc_cpu_s(agent.pid), metric_sum(agent.metrics(), gpu_runs), time.monotonic()
            time.sleep(cycles * interval)  # scrape rarely: a /metrics scrape costs the agent CPU too
            deadline = time.monotonic() + cycles * interval + 30
            while metric_sum(agent.metrics(), gpu_runs) - n0 < cycles and time.monotonic() < deadline:
                time.sleep(interval)
            c1, n1, w1 = proc_cpu_s(agent.pid), metric_sum(agent.metrics(), gpu_runs), time.monotonic()
            rss2, hwm2 = rss_kib(agent.pid)
        finally:
            agent.stop()
    done = n1 - n0
    print(
        f"agent process: every tier every {interval:g} s, warm-up {warmup:.0f} s after the first verdict, "
        f"{done:.0f} cycles in {w1 - w0:.0f} s"
    )
    print(f"{'RSS after warm-up':<34} {rss / 1024:>8.1f} MiB   (peak {hwm / 1024:.1f} MiB)")
    print(f"{'RSS after the cycles':<34} {rss2 / 1024:>8.1f} MiB   (peak {hwm2 / 1024:.1f} MiB)")
    print(f"{'CPU (user+sys) per cycle':<34} {(c1 - c0) * 1000 / done:>8.1f} ms  (every tier each cycle)")
    print(f"{'CPU share while cycling':<34} {(c1 - c0) / (w1 - w0) * 100:>8.1f} %  of one core")
    print(f"targets: RSS <= 64 MiB: {'met' if rss / 1024 <= 64 else 'MISSED'};  ", end="")
    print(f"CPU <= 20 ms per cycle: {'met' if (c1 - c0) * 1000 / done <= 20 else 'MISSED'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=30, help="in-process runs of every tier")
    ap.add_argument("--cycles", type=int, default=30, help="agent-process cycles measured")
    ap.add_argument("--interval", type=float, default=2.0, help="agent-process interval of every tier")
    ap.add_argument("--warmup", type=float, default=20.0, help="seconds after the first verdict")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--no-process", action="store_true", help="only the in-process measurement")
    args = ap.parse_args()
    print(f"footprint  machine: {machine()}")
    in_process(args.runs, args.profile)
    if not args.no_process:
        process(args.cycles, args.interval, args.warmup)


if __name__ == "__main__":
    main()
