"""Footprint: agent RSS after warm-up and CPU time per cycle on an 8-GPU snapshot.

Usage: python -m bench.footprint [--cycles 30] [--interval 2] [--runs 30] [--profile] [--no-process]
                                 [--auth in-cluster|kubeconfig|both] [--compare OLD_CHECKOUT] [--repeat N]
                                 [--cpu-ratio 1.1] [--rss-ratio 1.05]

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
   follower, the config poll, the Node watch, and a few /metrics scrapes (cycles are counted from
   `gpu_healthcheck_tier_duration_seconds_count`, read at the start, after --cycles intervals, then
   once per interval until enough have run). The CPU is also split by thread (/proc/PID/task; names
   from `py-spy dump` when py-spy is installed): the loop, the follower, the Node watch, and the
   probes' short-lived reader threads (what is left once the live threads are counted).
   --auth: how the agent reaches the API server: as in a pod (in-cluster: the client's in-cluster
   loader with a service account's token and CA, what a DaemonSet runs; the default), with a
   kubeconfig (the client's kubeconfig loader, which imports more of the client), or both.
   --compare DIR: the same measurement, in the same run, of the agent of another checkout (e.g. the
   old code: `git worktree add ../base main`), which runs with a kubeconfig when it has no
   --service-account-dir; --repeat N alternates the agents N times and prints each run, the median
   and the spread, and the old/new ratio of the medians. The machine's load average is printed with
   each run: CPU time is less disturbed by other work than wall time, not immune to it.
Targets are ratios against the old code in the same run (--compare; --cpu-ratio, --rss-ratio: new/old
at most; default 1.1 and 1.05, no worse than the old code beyond the spread of runs of one code on a
shared machine, e.g. 12.0-13.7 ms): absolute figures depend on the machine and are printed as
information, with the machine (CPU model, cores, load average) named.
--profile prints the top functions (cProfile, cumulative) of the in-process cycles and, when py-spy
is installed (the test extra), where the agent process spent its CPU over the measured cycles
(py-spy record, samples of threads not waiting, inclusive and own).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.config import load_config_dir
from agent.core.node_keys import Keys
from agent.engine.engine import Engine
from agent.engine.write_policy import fingerprint
from agent.probes.snapshot import SnapshotSource
from bench._kube import (
    HEALTHY,
    ROOT,
    AgentProcess,
    core_api,
    free_port,
    kube_env,
    machine,
    metric_sum,
    pct,
    proc_cpu_s,
    proc_rss_kb,
    service_account_dir,
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


def thread_ticks(pid: int) -> dict[int, int]:
    """user+sys clock ticks of each live thread of *pid*."""
    out: dict[int, int] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            out[int(tid)] = int(fields[11]) + int(fields[12])
    return out


def py_spy() -> str | None:
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


def thread_names(pid: int) -> dict[int, str]:
    """Native thread id → Python thread name, from `py-spy dump` ({} without py-spy)."""
    spy = py_spy()
    if spy is None:
        return {}
    proc = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, check=False)
    names: dict[int, str] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("Thread ") and '"' in line:
            with contextlib.suppress(ValueError, IndexError):
                names[int(line.split()[1], 0)] = line.split('"')[1]
    return names


def thread_role(name: str) -> str:
    for prefix, role in (
        ("MainThread", "loop"),
        ("kernel-follower", "follower"),
        ("node-watch", "node watch"),
    ):
        if name.startswith(prefix):
            return role
    return "other threads"


WAITING = ("wait (threading", "acquire", "select (", "poll (", "accept (", "recv", "_wait_for_tstate_lock")


def spy_report(raw: Path, top: int = 25) -> str:
    """Top functions of a `py-spy record -f raw` file, leaving out samples of threads that wait."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not count.isdigit() or any(w in frames[-1] for w in WAITING):
            continue
        n = int(count)
        total += n
        own[frames[-1]] += n
        for frame in dict.fromkeys(frames):
            inclusive[frame] += n
    lines = [f"py-spy: {total} samples of threads not waiting; inclusive, then own:"]
    lines += [f"{n / total * 100:6.1f}%  {f}" for f, n in inclusive.most_common(top)]
    lines += ["---"] + [f"{n / total * 100:6.1f}%  {f}" for f, n in own.most_common(top)]
    return "\n".join(lines)


@dataclass
class Run:
    label: str
    auth: str
    rss: float  # MiB after warm-up
    hwm: float
    rss_after: float
    cpu_ms: float  # per cycle
    share: float  # % of one core
    cycles: int
    load: float  # 1-minute load average at the end
    threads: dict[str, float] = field(default_factory=dict)  # role -> ms per cycle


def process(
    env: Any,
    work: Path,
    n: int,
    *,
    label: str,
    root: Path,
    auth: str,
    cycles: int,
    interval: float,
    warmup: float,
    profile: bool,
) -> Run:
    node = f"bench-footprint-{n}"
    env.make_gpu_node(node, instance_type="p5.48xlarge", gpus=8)
    snap = snapshot_copy(work / f"snap-{n}")
    cfg = write_config(
        work / f"config-{n}",
        f"intervals:\n  gpu: {interval:g}\n  efa: {interval:g}\n  topology: {interval:g}\n"
        "jitterFraction: 0\n",
    )
    port = free_port()
    sa = service_account_dir(env, work / "serviceaccount") if auth == "in-cluster" else None
    agent = AgentProcess(
        env, node, snap, cfg, work / f"agent-{n}.log", metrics_port=port, service_account=sa, root=root
    )
    core = core_api(env)
    spy = py_spy() if profile else None
    try:
        wait_for(
            lambda: (core.read_node(node).metadata.labels or {}).get(Keys().status) == "pass",
            60,
            "first verdict",
        )
        time.sleep(warmup)
        rss, hwm = rss_kib(agent.pid)
        names = thread_names(agent.pid)
        gpu_runs = "gpu_healthcheck_tier_duration_seconds_count{tier=gpu"
        t0 = thread_ticks(agent.pid)
        c0, n0, w0 = proc_cpu_s(agent.pid), metric_sum(agent.metrics(), gpu_runs), time.monotonic()
        recorder = None
        if spy is not None:
            raw = work / f"spy-{n}.txt"
            recorder = subprocess.Popen(
                [spy, "record", "-p", str(agent.pid), "-d", str(int(cycles * interval)), "-r", "500",
                 "--nonblocking", "-f", "raw", "-o", str(raw)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        time.sleep(cycles * interval)  # scrape rarely: a /metrics scrape costs the agent CPU too
        deadline = time.monotonic() + cycles * interval + 30
        while metric_sum(agent.metrics(), gpu_runs) - n0 < cycles and time.monotonic() < deadline:
            time.sleep(interval)
        c1, n1, w1 = proc_cpu_s(agent.pid), metric_sum(agent.metrics(), gpu_runs), time.monotonic()
        t1 = thread_ticks(agent.pid)
        rss2, _ = rss_kib(agent.pid)
        if recorder is not None:
            recorder.wait(60)
    finally:
        agent.stop()
    done = int(n1 - n0)
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    threads: dict[str, float] = defaultdict(float)
    for tid, ticks in t1.items():
        role = thread_role(names.get(tid, "")) if names else "live threads"
        threads[role] += (ticks - t0.get(tid, 0)) * tick_ms / done
    threads["probe reads (short-lived threads)"] = (c1 - c0) * 1000 / done - sum(threads.values())
    if spy is not None and (work / f"spy-{n}.txt").exists():
        print(f"--- {label} ({auth}) ---")
        print(spy_report(work / f"spy-{n}.txt"))
    return Run(
        label,
        auth,
        rss / 1024,
        hwm / 1024,
        rss2 / 1024,
        (c1 - c0) * 1000 / done,
        (c1 - c0) / (w1 - w0) * 100,
        done,
        os.getloadavg()[0],
        dict(threads),
    )


def report(runs: list[Run], interval: float, warmup: float, cpu_ratio: float, rss_ratio: float) -> None:
    print(
        f"agent process: every tier every {interval:g} s, warm-up {warmup:.0f} s after the first verdict; "
        "CPU = user+sys of all threads per gpu cycle (every tier each cycle)"
    )
    print(
        f"{'agent':<6} {'auth':<11} {'RSS MiB':>8} {'peak':>6} {'after':>6} {'CPU ms':>7} {'% core':>7} "
        f"{'cycles':>6} {'load':>5}  CPU ms/cycle by thread"
    )
    for r in runs:
        by = ", ".join(f"{k} {v:.1f}" for k, v in r.threads.items() if round(v, 1))
        print(
            f"{r.label:<6} {r.auth:<11} {r.rss:>8.1f} {r.hwm:>6.1f} {r.rss_after:>6.1f} {r.cpu_ms:>7.1f} "
            f"{r.share:>7.2f} {r.cycles:>6} {r.load:>5.2f}  {by}"
        )
    groups: dict[tuple[str, str], list[Run]] = defaultdict(list)
    for r in runs:
        groups[(r.label, r.auth)].append(r)
    if len(runs) > len(groups):
        print("median [min-max] over the runs:")
        for (label, auth), rs in groups.items():
            cpu, rss = [r.cpu_ms for r in rs], [r.rss for r in rs]
            print(
                f"  {label:<6} {auth:<11} RSS {statistics.median(rss):.1f} [{min(rss):.1f}-{max(rss):.1f}] "
                f"MiB, CPU {statistics.median(cpu):.1f} [{min(cpu):.1f}-{max(cpu):.1f}] ms/cycle "
                f"({len(rs)} runs)"
            )
    old = [r for r in runs if r.label == "old"]
    for auth in ("in-cluster", "kubeconfig"):
        new = [r for r in runs if r.label == "new" and r.auth == auth]
        if old and new:
            o_cpu, n_cpu = statistics.median(r.cpu_ms for r in old), statistics.median(r.cpu_ms for r in new)
            o_rss, n_rss = statistics.median(r.rss for r in old), statistics.median(r.rss for r in new)
            print(
                f"old ({old[0].auth}) / new ({auth}): CPU {o_cpu:.1f} / {n_cpu:.1f} ms "
                f"= {o_cpu / n_cpu:.2f}x, "
                f"RSS {o_rss:.1f} / {n_rss:.1f} MiB = {o_rss / n_rss:.2f}x"
            )
    judge(runs, cpu_ratio, rss_ratio)


def judge(runs: list[Run], cpu_ratio: float, rss_ratio: float) -> None:
    """The targets are ratios against the old code measured in the same run: absolute ms depend on
    the machine (another 2-core machine measured the same code at 19-32 ms per cycle where this one
    measured 13.2 ms; the old/new ratio, 1.79x, was the same on both)."""
    old = [r for r in runs if r.label == "old"]
    new = [r for r in runs if r.label == "new"]
    if not new:
        return
    auth = new[0].auth
    mine = [r for r in new if r.auth == auth]
    if not old:
        print(
            "targets: judged as ratios against the old code on the same machine (--compare DIR); "
            "the figures above are this machine's only"
        )
        return
    cpu = statistics.median(r.cpu_ms for r in mine) / statistics.median(r.cpu_ms for r in old)
    rss = statistics.median(r.rss for r in mine) / statistics.median(r.rss for r in old)
    print(
        f"targets ({auth}, new/old on this machine): CPU per cycle {cpu:.2f} <= {cpu_ratio:.2f}: "
        f"{'met' if cpu <= cpu_ratio else 'MISSED'};  RSS {rss:.2f} <= {rss_ratio:.2f}: "
        f"{'met' if rss <= rss_ratio else 'MISSED'}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=30, help="in-process runs of every tier")
    ap.add_argument("--cycles", type=int, default=30, help="agent-process cycles measured")
    ap.add_argument("--interval", type=float, default=2.0, help="agent-process interval of every tier")
    ap.add_argument("--warmup", type=float, default=20.0, help="seconds after the first verdict")
    ap.add_argument("--auth", choices=("in-cluster", "kubeconfig", "both"), default="in-cluster")
    ap.add_argument("--compare", type=Path, metavar="DIR", help="also measure the agent of this checkout")
    ap.add_argument("--repeat", type=int, default=1, help="measure each agent this many times, alternating")
    ap.add_argument(
        "--cpu-ratio", type=float, default=1.1, help="target: new/old CPU per cycle at most this (--compare)"
    )
    ap.add_argument(
        "--rss-ratio", type=float, default=1.05, help="target: new/old RSS at most this (--compare)"
    )
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--no-process", action="store_true", help="only the in-process measurement")
    args = ap.parse_args()
    print(f"footprint  machine: {machine()}, load average {os.getloadavg()[0]:.2f}")
    in_process(args.runs, args.profile)
    if args.no_process:
        return
    auths = ("in-cluster", "kubeconfig") if args.auth == "both" else (args.auth,)
    agents = [("new", ROOT, auth) for auth in auths]
    if args.compare is not None:
        old_root = args.compare.resolve()
        # the flag's home: cli/main.py, or cli/parser.py since the parser moved out of it
        old_cli = "".join(
            f.read_text()
            for f in (old_root / "agent" / "cli" / n for n in ("main.py", "parser.py"))
            if f.exists()
        )
        old_auth = (
            "in-cluster" if "--service-account-dir" in old_cli and args.auth != "kubeconfig" else "kubeconfig"
        )
        agents.append(("old", old_root, old_auth))
        print(f"old: the agent of {old_root} (auth {old_auth})")
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="bench-foot-") as tmp, kube_env() as env:
        for rep in range(args.repeat):
            for label, root, auth in agents if rep % 2 == 0 else agents[::-1]:
                run = process(
                    env,
                    Path(tmp),
                    len(runs),
                    label=label,
                    root=root,
                    auth=auth,
                    cycles=args.cycles,
                    interval=args.interval,
                    warmup=args.warmup,
                    profile=args.profile,
                )
                runs.append(run)
                print(
                    f"  run {len(runs)}: {label} ({auth}) RSS {run.rss:.1f} MiB, "
                    f"CPU {run.cpu_ms:.1f} ms/cycle, load {run.load:.2f}",
                    flush=True,
                )
    print(f"machine: {machine()}, load average at the end {os.getloadavg()[0]:.2f}")
    report(runs, args.interval, args.warmup, args.cpu_ratio, args.rss_ratio)


if __name__ == "__main__":
    main()
