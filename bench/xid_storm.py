"""An Xid storm on a snapshot-backed agent: agent CPU, fault-to-taint, RSS and Node writes.

Usage: python -m bench.xid_storm [--shape batches|varied|pids|unique|steady|all[,...]] [--repeat N]
                                 [--compare OLD_CHECKOUT] [--gpu-interval 10] [--profile]
                                 [--taint-timeout 240]

A real etcd + kube-apiserver (tests/kubeenv), one GPU Node per agent, one agent process per checkout
on a copy of the bundled healthy p5.48xlarge snapshot (default tier intervals but gpu 10 s, so that
a "reboot" untaints soon). Each trial
starts on a "rebooted" node (new boot_id, healthy kmsg.log, the Node untainted and `pass`), then:

- batches: 400,000 Xid 13 and Xid 31 lines across the 8 GPUs appended to
  kmsg.log in 20 batches of 20,000 lines (one write each), 0.5 s apart, then one Xid 79 line;
- varied: the same, but each Xid 13 names one of the GPU's SMs (GPC, TPC, SM) and each Xid 31 its
  own fault address, as a job's faults do: few lines repeat a text the agent has seen;
- pids: the same, but each line names its own pid (977 in turn: a job's processes) and each Xid 31
  its own fault address, so almost every line's text is new to the agent;
- unique: the same, but every line's text differs: its own pid, its own process name and, for an
  Xid 31, its own fault address (no text ever repeats; the worst case for a reader that folds texts);
- steady: 400,000 Xid 13/31 lines on one GPU appended in whole-line batches
  every 10 ms for 10 s; the Xid 79 at the tail (trial `steady-tail`) and, in a second trial, halfway
  through while the storm goes on (`steady-middle`).

The lines are in the snapshot's `dmesg --decode --time-format iso` format, stamped with the time their
batch is written, and built beforehand, so the benchmark's own CPU does not compete with the agent's.
Printed per trial: fault-to-taint (benchmark clock, from the end of the Xid 79's write to the first
watch event of the Node with our taint), the agent's CPU (user+sys of all threads, /proc/PID/stat)
from the storm's first write to the taint and to the taint + 6 s (the follower wakes the engine for
counts at most every 5 s: the last such wake-up and its Node write come after the storm), that CPU
split by thread (the loop, the follower, the rest), RSS before and after, and the Node writes the API
server counted during the storm (`apiserver_request_total`, nodes and nodes/status, PATCH/PUT/POST).

--compare DIR: the agent of another checkout (the old code; `git worktree add ../old <commit>`) on a
Node of its own, in the same run; --repeat N trials of each shape per agent, alternating new/old
(then old/new) so that load on the machine hits both alike. Printed: every trial with the load
average, the medians and ranges, and the old/new ratios of the medians. --profile samples the agent
processes with py-spy (test extra; needs ptrace) during the storm of every trial and prints, per
agent and shape, the top functions of the threads that did not wait (the profiled trials' figures
include py-spy's reads of the process: compare figures of runs without --profile).

Targets: fault-to-taint <= 1 s, Node writes <= 10, RSS growth <= 16 MiB, and with --compare the
storm's CPU at or below the old code's (new/old <= 1.0).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from agent.core.node_keys import Keys
from bench._kube import (
    HEALTHY,
    ROOT,
    AgentProcess,
    NodeWatch,
    apiserver_requests,
    core_api,
    diff,
    kube_env,
    machine,
    our_taint,
    proc_cpu_s,
    proc_rss_kb,
    snapshot_copy,
    wait_for,
    write_config,
)
from bench.footprint import py_spy, spy_report, thread_names, thread_role, thread_ticks

GPUS = ("53", "64", "75", "86", "97", "a8", "b9", "ca")  # the p5.48xlarge snapshot's GPU buses
STORM = (
    "NVRM: Xid (PCI:0000:{bus}:00): 13, pid='{pid}', name=python3, Graphics SM Warp Exception on "
    "(GPC {gpc}, TPC {tpc}, SM {sm}): Out Of Range Address",
    "NVRM: Xid (PCI:0000:{bus}:00): 31, pid={pid}, name=python3, Ch 00000010, intr 00000000. MMU Fault: "
    "ENGINE GRAPHICS GPCCLIENT_T1_2 faulted @ 0x7f3a_{addr:08x}. Fault is of type FAULT_PDE ACCESS_TYPE_READ",
)
PIDS = 977  # the pids shape: a job's processes, one per line in turn
XID79 = "NVRM: Xid (PCI:0000:97:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
WRITES = ("PATCH", "PUT", "POST", "UPDATE", "CREATE", "APPLY")
SETTLE_S = 6.0  # after the taint: the follower's last counts wake-up (COUNTS_EVERY_S 5 s) and its write


@dataclass(frozen=True)
class Shape:
    """One storm: `lines` lines across `gpus` GPUs in `batches` writes `gap_s` apart; the Xid 79 at
    the tail or (middle) after half the batches."""

    name: str
    lines: int
    batches: int
    gap_s: float
    gpus: int
    middle: bool = False
    varied: bool = False  # each line's own text (SM, fault address), not the same two per GPU
    pids: bool = False  # each line its own pid (PIDS in turn) and each Xid 31 its own address
    unique: bool = False  # every line its own pid, process name and (Xid 31) address: no text repeats

    def describe(self) -> str:
        at = "halfway through" if self.middle else "after the storm"
        texts = (
            "each its own text (SM, address)"
            if self.varied
            else "every text unique: its own pid, name and Xid 31 address"
            if self.unique
            else f"each its own pid ({PIDS} in turn), each Xid 31 its own address"
            if self.pids
            else f"{2 * self.gpus} texts"
        )
        return (
            f"{self.name}: {self.lines:,} Xid 13/31 lines ({texts}) on {self.gpus} GPU(s), "
            f"{self.batches} writes "
            f"of {self.lines // self.batches:,} lines {self.gap_s * 1000:g} ms apart, the Xid 79 {at}"
        )


SHAPES = ("batches", "varied", "pids", "unique", "steady", "all")


def shape_list(text: str) -> str:
    """--shape: one of SHAPES, or several joined by commas ("batches,pids")."""
    if not text or any(part not in SHAPES for part in text.split(",")):
        raise argparse.ArgumentTypeError(f"{text!r}: one or more of {', '.join(SHAPES)}, comma-separated")
    return text


def shapes(which: str, lines: int) -> list[Shape]:
    if "," in which:
        return [s for part in which.split(",") for s in shapes(part, lines)]
    out = []
    if which in ("batches", "all"):
        out.append(Shape("batches", lines, 20, 0.5, 8))
    if which in ("varied", "all"):
        out.append(Shape("varied", lines, 20, 0.5, 8, varied=True))
    if which in ("pids", "all"):
        out.append(Shape("pids", lines, 20, 0.5, 8, pids=True))
    if which in ("unique", "all"):
        out.append(Shape("unique", lines, 20, 0.5, 8, unique=True))
    if which in ("steady", "all"):
        out.append(Shape("steady-tail", lines, 1000, 0.01, 1))
        out.append(Shape("steady-middle", lines, 1000, 0.01, 1, middle=True))
    return out


def _stamp(at: float | None = None) -> str:
    now = datetime.fromtimestamp(time.time() if at is None else at, timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S,") + f"{now.microsecond:06d}+00:00"


def _line(level: str, msg: str, at: float | None = None) -> bytes:
    return f"kern  :{level:<5} : {_stamp(at)} {msg}\n".encode()


def _text(shape: Shape, k: int) -> str:
    """Line k's text: Xid 13 and 31 alternating, the GPUs taking turns; varied, each Xid 13 on one of
    the GPU's 1,056 SMs and each Xid 31 at its own address, as a job's faults are."""
    code, g = k % 2, k // 2 % shape.gpus
    if (
        shape.unique
    ):  # nothing repeats: the pid, the name (a process name is at most 15 bytes) and the address
        text = STORM[code].format(
            bus=GPUS[g], pid=100000 + k, gpc=4, tpc=1, sm=0, addr=0x2C000000 + (k << 12)
        )
        return text.replace("name=python3,", f"name=py{k:07d},", 1)
    if shape.pids:  # the pids in turn (a text repeats only 2 x 8 x 977 lines later), each address new
        v = k // (2 * shape.gpus)
        pid = 20000 + 37 * (k % PIDS)
        return STORM[code].format(bus=GPUS[g], pid=pid, gpc=4, tpc=1, sm=0, addr=0x2C000000 + (v << 12))
    if not shape.varied:
        return STORM[code].format(bus=GPUS[g], pid=48213, gpc=4, tpc=1, sm=0, addr=0x2C000000)
    v = k // (2 * shape.gpus)
    return STORM[code].format(
        bus=GPUS[g], pid=48213, gpc=v % 8, tpc=v // 8 % 66, sm=v // 528 % 2, addr=0x2C000000 + (v << 12)
    )


def storm_batches(shape: Shape, begin: float) -> list[bytes]:
    """The storm's writes, each stamped with the time it will be written (from `begin`)."""
    fixed = (
        [_text(shape, k) for k in range(2 * shape.gpus)]
        if not (shape.varied or shape.pids or shape.unique)
        else []
    )
    per = shape.lines // shape.batches
    out: list[bytes] = []
    written = 0
    for b in range(shape.batches):
        n = per if b < shape.batches - 1 else shape.lines - written
        at = begin + b * shape.gap_s
        step = min(shape.gap_s, 0.01) / n
        stamps = [_stamp(at + i * step) for i in range(0, n, 64)]  # strftime is the builder's cost
        texts = (fixed[(written + i) % len(fixed)] if fixed else _text(shape, written + i) for i in range(n))
        out.append(b"".join(f"kern  :warn  : {stamps[i // 64]} {t}\n".encode() for i, t in enumerate(texts)))
        written += n
    return out


def run_storm(fd: int, shape: Shape, data: list[bytes], begin: float) -> float | None:
    """Write the batches on their schedule; the perf_counter() after the middle Xid 79 (None without)."""
    time.sleep(max(0.0, begin - time.time()))
    start = time.monotonic()
    t_mid = None
    for b, chunk in enumerate(data):
        os.write(fd, chunk)
        if shape.middle and t_mid is None and b == shape.batches // 2:
            os.write(fd, _line("err", XID79))
            t_mid = time.perf_counter()
        if b < len(data) - 1:
            wait = start + (b + 1) * shape.gap_s - time.monotonic()
            if wait > 0:
                time.sleep(wait)
    return t_mid


@dataclass
class Subject:
    label: str
    root: Path
    node: str
    snap: Path
    agent: Any = None
    watch: Any = None
    names: dict[int, str] = field(default_factory=dict)


@dataclass
class Trial:
    label: str
    shape: str
    ms: float  # fault-to-taint
    cpu_taint: float  # s, the storm's first write to the taint
    cpu: float  # s, to the taint + SETTLE_S
    threads: dict[str, float]  # role -> s (to the taint + SETTLE_S)
    rss0: float
    rss1: float
    writes: int
    load: float


def _node_writes(env: Any, before: dict[Any, float]) -> int:
    d = diff(apiserver_requests(env, ("nodes",)), before)
    return int(sum(v for (res, verb, _), v in d.items() if res.startswith("nodes") and verb in WRITES))


def _ready(core: Any, node: str) -> bool:
    n = core.read_node(node)
    untainted = our_taint(core.api_client.sanitize_for_serialization(n)) is None
    return untainted and (n.metadata.labels or {}).get(Keys().status) == "pass"


def _reboot(s: Subject, healthy: bytes, core: Any) -> None:
    (s.snap / "kmsg.log").write_bytes(healthy)
    (s.snap / "boot_id").write_text(str(uuid.uuid4()) + "\n")
    wait_for(lambda: _ready(core, s.node), 180, f"{s.label}: untainted and pass after the reboot")
    time.sleep(2.0)


def trial(
    env: Any, core: Any, s: Subject, shape: Shape, healthy: bytes, spy_raw: Path | None, wait_s: float = 240
) -> Trial:
    _reboot(s, healthy, core)
    begin = time.time() + 3.0
    data = storm_batches(shape, begin)
    rss0 = proc_rss_kb(s.agent.pid)
    req0 = apiserver_requests(env, ("nodes",))
    s.watch.drain()
    recorder = None
    if spy_raw is not None:
        spy = py_spy()
        assert spy is not None
        seconds = max(1, round(begin - time.time() + shape.batches * shape.gap_s + 2 + SETTLE_S))
        recorder = subprocess.Popen(
            [spy, "record", "-p", str(s.agent.pid), "-d", str(seconds), "-r", "200",
             "--nonblocking", "-f", "raw", "-o", str(spy_raw)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
    time.sleep(max(0.0, begin - time.time() - 0.3))
    t0_threads, cpu0 = thread_ticks(s.agent.pid), proc_cpu_s(s.agent.pid)
    fd = os.open(s.snap / "kmsg.log", os.O_WRONLY | os.O_APPEND)
    try:
        mid = run_storm(fd, shape, data, begin)
        del data
        writes = _node_writes(env, req0)
        if mid is None:
            assert our_taint(s.watch.drain() or {}) is None, "tainted before the Xid 79"
            os.write(fd, _line("err", XID79))
            t0 = time.perf_counter()
        else:
            t0 = mid
        t1 = s.watch.wait(lambda n: our_taint(n) is not None, wait_s)
        cpu_taint = proc_cpu_s(s.agent.pid) - cpu0
    finally:
        os.close(fd)
    time.sleep(max(0.0, SETTLE_S - (time.perf_counter() - t1)))
    cpu = proc_cpu_s(s.agent.pid) - cpu0
    t1_threads = thread_ticks(s.agent.pid)
    if recorder is not None:
        recorder.wait(120)
    tick = 1 / os.sysconf("SC_CLK_TCK")
    threads: dict[str, float] = defaultdict(float)
    for tid, ticks in t1_threads.items():
        role = thread_role(s.names.get(tid, "")) if s.names else "live threads"
        threads[role] += (ticks - t0_threads.get(tid, 0)) * tick
    threads["short-lived threads"] = max(0.0, cpu - sum(threads.values()))
    return Trial(
        s.label,
        shape.name,
        (t1 - t0) * 1000,
        cpu_taint,
        cpu,
        dict(threads),
        rss0 / 1024,
        proc_rss_kb(s.agent.pid) / 1024,
        writes,
        os.getloadavg()[0],
    )


def _fmt_threads(threads: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in threads.items() if round(v, 2))


def _one_line(t: Trial) -> str:
    return (
        f"{t.label} {t.shape}: taint {t.ms:.0f} ms, CPU {t.cpu_taint:.2f} s to the taint, {t.cpu:.2f} s +6 s "
        f"({_fmt_threads(t.threads)}), load {t.load:.2f}"
    )


def report(trials: list[Trial], shapes_run: list[Shape]) -> None:
    print(
        f"{'agent':<5} {'shape':<13} {'taint ms':>8} {'CPU s to taint':>14} {'CPU s +6s':>9} "
        f"{'RSS MiB':>7} {'after':>6} {'writes':>6} {'load':>5}  CPU s by thread"
    )
    for t in trials:
        print(
            f"{t.label:<5} {t.shape:<13} {t.ms:>8.0f} {t.cpu_taint:>14.2f} {t.cpu:>9.2f} {t.rss0:>7.1f} "
            f"{t.rss1:>6.1f} {t.writes:>6} {t.load:>5.2f}  {_fmt_threads(t.threads)}"
        )
    groups: dict[tuple[str, str], list[Trial]] = defaultdict(list)
    for t in trials:
        groups[(t.shape, t.label)].append(t)
    print("median [min-max]:")
    for (shape, label), ts in groups.items():
        parts = []
        for what, vals, f in (
            ("fault-to-taint ms", [t.ms for t in ts], "{:.0f}"),
            ("CPU s to taint", [t.cpu_taint for t in ts], "{:.2f}"),
            ("CPU s +6s", [t.cpu for t in ts], "{:.2f}"),
        ):
            med = f.format(statistics.median(vals))
            parts.append(f"{what} {med} [{f.format(min(vals))}-{f.format(max(vals))}]")
        print(f"  {label:<5} {shape:<13} " + ", ".join(parts) + f" ({len(ts)} trials)")
    for shape in shapes_run:
        old, new = groups.get((shape.name, "old")), groups.get((shape.name, "new"))
        if old and new:
            o, n = statistics.median(t.cpu for t in old), statistics.median(t.cpu for t in new)
            om, nm = statistics.median(t.ms for t in old), statistics.median(t.ms for t in new)
            print(
                f"new/old ({shape.name}): CPU {n:.2f} / {o:.2f} s = {n / o:.2f}x "
                f"({'at or below the old: met' if n <= o else 'MISSED'}); "
                f"fault-to-taint {nm:.0f} / {om:.0f} ms = {nm / om:.2f}x"
            )
    new_trials = [t for t in trials if t.label == "new"]
    worst = max(t.ms for t in new_trials)
    growth = max(t.rss1 - t.rss0 for t in new_trials)
    most = max(t.writes for t in new_trials)
    print(
        f"targets (new): fault-to-taint <= 1000 ms {'met' if worst <= 1000 else 'MISSED'} "
        f"(worst {worst:.0f}); "
        f"Node writes <= 10 {'met' if most <= 10 else 'MISSED'} (most {most}); "
        f"RSS growth <= 16 MiB {'met' if growth <= 16 else 'MISSED'} (most {growth:.1f})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", type=shape_list, default="batches", help="one or more of " + ", ".join(SHAPES))
    ap.add_argument("--lines", type=int, default=400_000)
    ap.add_argument("--repeat", type=int, default=2, help="trials of each shape per agent, alternating")
    ap.add_argument("--gpu-interval", type=float, default=10.0, help="how soon a reboot untaints")
    ap.add_argument("--compare", type=Path, metavar="DIR", help="also measure the agent of this checkout")
    ap.add_argument("--profile", action="store_true", help="py-spy the agents during the storms")
    ap.add_argument("--taint-timeout", type=float, default=240.0, help="s to wait for the taint")
    args = ap.parse_args()
    run_shapes = shapes(args.shape, args.lines)
    checkouts = [("new", ROOT)] + ([("old", args.compare.resolve())] if args.compare else [])
    if args.profile and py_spy() is None:
        raise SystemExit("--profile needs py-spy (the test extra)")
    print(f"xid_storm  machine: {machine()}, load average {os.getloadavg()[0]:.2f}")
    for shape in run_shapes:
        print(f"shape {shape.describe()}")
    trials: list[Trial] = []
    spied: dict[tuple[str, str], list[Path]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="bench-storm-") as tmp, kube_env() as env:
        work = Path(tmp)
        healthy = (HEALTHY / "kmsg.log").read_bytes()
        cfg = write_config(
            work / "config",
            f"intervals:\n  gpu: {args.gpu_interval:g}\nnode:\n  recoverAfter: 1\n  maxTaintedFraction: 1.0\n"
            "metrics:\n  port: 0\n",
        )
        core = core_api(env)
        subjects = [
            Subject(label, root, f"bench-storm-{label}", work / f"snap-{label}") for label, root in checkouts
        ]
        try:
            for s in subjects:
                env.make_gpu_node(s.node, instance_type="p5.48xlarge", gpus=8)
                snapshot_copy(s.snap)
                s.agent = AgentProcess(env, s.node, s.snap, cfg, work / f"agent-{s.label}.log", root=s.root)
                s.watch = NodeWatch(core, s.node)
            for s in subjects:
                wait_for(lambda s=s: _ready(core, s.node), 90, f"{s.label}: first verdict pass")
                s.names = thread_names(s.agent.pid)
            for rep in range(args.repeat):
                for shape in run_shapes:
                    for s in subjects if rep % 2 == 0 else subjects[::-1]:
                        raw = work / f"spy-{s.label}-{shape.name}-{rep}.txt" if args.profile else None
                        t = trial(env, core, s, shape, healthy, raw, args.taint_timeout)
                        trials.append(t)
                        if raw is not None:
                            spied[(s.label, shape.name)].append(raw)
                        print(f"  trial {len(trials)}: {_one_line(t)}", flush=True)
        finally:
            for s in subjects:
                if s.watch is not None:
                    s.watch.stop()
                if s.agent is not None:
                    s.agent.stop()
        for (label, shape_name), raws in spied.items():
            merged = work / f"spy-{label}-{shape_name}.txt"
            merged.write_text("".join(r.read_text() for r in raws if r.exists()))
            print(f"--- py-spy: {label}, {shape_name} ({len(raws)} storms) ---")
            print(spy_report(merged))
        print(f"apiserver {env.version}; intervals.gpu={args.gpu_interval:g}s, snapshot p5.48xlarge-healthy")
    report(trials, run_shapes)


if __name__ == "__main__":
    main()
