"""An Xid storm on a snapshot-backed agent: 400,000 Xid 13/31 lines in 10 s, then an Xid 79.

Usage: python -m bench.xid_storm [--lines 400000] [--seconds 10] [--gpu-interval 60]

A real etcd + kube-apiserver (tests/kubeenv), one GPU Node, one agent process on a copy of the
bundled healthy p5.48xlarge snapshot (default tier intervals, gpu 60 s). Two trials, each on a
"rebooted" node (new boot_id, healthy kmsg.log, the Node untainted and `pass` first):

- tail: the storm (Xid 13 and 31 alternating on one GPU, the way a job's faults repeat, in the
  snapshot's own dmesg format with wall-clock stamps that advance in real time) is appended in
  batches of whole lines every 10 ms; then one Xid 79 line on another GPU. Printed: fault-to-taint
  (benchmark clock, from the end of the 79's append to the first watch event of the Node with our
  taint), the agent's CPU seconds during the storm (/proc/PID/stat, all threads) and per 1,000 lines,
  its RSS before and after, and the Node writes the API server counted during the storm
  (`apiserver_request_total`, nodes and nodes/status, PATCH/PUT/POST).
- middle: the same storm with the Xid 79 written halfway through; fault-to-taint while the storm
  goes on.

Targets (issue 15): fault-to-taint <= 1 s, Node writes <= 10, RSS growth <= 16 MiB, CPU per 1,000
lines <= 10 ms.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from agent.core.contract import Keys
from bench._kube import (
    HEALTHY,
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

STORM = (
    "NVRM: Xid (PCI:0000:53:00): 13, pid='48213', name=python3, Graphics SM Warp Exception on "
    "(GPC 4, TPC 1, SM 0): Out Of Range Address",
    "NVRM: Xid (PCI:0000:53:00): 31, pid=48213, name=python3, Ch 00000010, intr 00000000. MMU Fault: "
    "ENGINE GRAPHICS GPCCLIENT_T1_2 faulted @ 0x7f3a_2c000000. Fault is of type FAULT_PDE ACCESS_TYPE_READ",
)
XID79 = "NVRM: Xid (PCI:0000:97:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
BATCH_S = 0.01
WRITES = ("PATCH", "PUT", "POST", "UPDATE", "CREATE", "APPLY")


def _stamp(at: float | None = None) -> str:
    now = datetime.fromtimestamp(time.time() if at is None else at, timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S,") + f"{now.microsecond:06d}+00:00"


def _line(level: str, msg: str, at: float | None = None) -> bytes:
    return f"kern  :{level:<5} : {_stamp(at)} {msg}\n".encode()


def _node_writes(env: Any, before: dict[Any, float]) -> int:
    d = diff(apiserver_requests(env, ("nodes",)), before)
    return int(sum(v for (res, verb, _), v in d.items() if res.startswith("nodes") and verb in WRITES))


def _storm(fd: int, lines: int, seconds: float, at_middle: bytes | None = None) -> float | None:
    """Append `lines` storm lines over `seconds` in whole-line batches; returns the perf_counter()
    after the middle line was written (None without one). The batches are made beforehand, stamped
    with the time each will be written, so the benchmark's own CPU does not compete with the agent's
    while the storm runs."""
    batches = max(1, int(seconds / BATCH_S))
    per = lines // batches
    begin = time.time() + 2.0
    data: list[bytes] = []
    written = 0
    for b in range(batches):
        n = per if b < batches - 1 else lines - written
        at = begin + b * BATCH_S
        data.append(b"".join(_line("warn", STORM[(written + i) % 2], at + i * BATCH_S / n) for i in range(n)))
        written += n
    time.sleep(max(0.0, begin - time.time()))
    start = time.monotonic()
    t_mid = None
    for b, chunk in enumerate(data):
        os.write(fd, chunk)
        if at_middle is not None and t_mid is None and b == batches // 2:
            os.write(fd, at_middle)
            t_mid = time.perf_counter()
        wait = start + (b + 1) * BATCH_S - time.monotonic()
        if wait > 0:
            time.sleep(wait)
    return t_mid


def _reboot(snap: Path, healthy: bytes, core: Any, node: str) -> None:
    (snap / "boot_id").write_text(str(uuid.uuid4()) + "\n")
    (snap / "kmsg.log").write_bytes(healthy)
    wait_for(
        lambda: (
            our_taint(core.api_client.sanitize_for_serialization(core.read_node(node))) is None
            and (core.read_node(node).metadata.labels or {}).get(Keys().status) == "pass"
        ),
        120,
        "untainted and pass after the reboot",
    )
    time.sleep(1.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lines", type=int, default=400_000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--gpu-interval", type=float, default=60.0)
    args = ap.parse_args()
    rows: list[tuple[str, float, float, float, float, int, int]] = []
    with tempfile.TemporaryDirectory(prefix="bench-storm-") as tmp, kube_env() as env:
        work = Path(tmp)
        node = "bench-storm-node"
        env.make_gpu_node(node, instance_type="p5.48xlarge", gpus=8)
        snap = snapshot_copy(work / "snap")
        healthy = (HEALTHY / "kmsg.log").read_bytes()
        cfg = write_config(
            work / "config",
            f"intervals:\n  gpu: {args.gpu_interval:g}\nnode:\n  recoverAfter: 1\nmetrics:\n  port: 0\n",
        )
        core = core_api(env)
        agent = AgentProcess(env, node, snap, cfg, work / "agent.log")
        watch = NodeWatch(core, node)
        try:
            wait_for(
                lambda: (core.read_node(node).metadata.labels or {}).get(Keys().status) == "pass",
                60,
                "first verdict pass",
            )
            for trial in ("tail", "middle"):
                if trial == "middle":
                    _reboot(snap, healthy, core, node)
                time.sleep(2.0)
                rss0, cpu0 = proc_rss_kb(agent.pid), proc_cpu_s(agent.pid)
                req0 = apiserver_requests(env, ("nodes",))
                fd = os.open(snap / "kmsg.log", os.O_WRONLY | os.O_APPEND)
                try:
                    watch.drain()
                    if trial == "tail":
                        _storm(fd, args.lines, args.seconds)
                        cpu1 = proc_cpu_s(agent.pid)
                        writes = _node_writes(env, req0)
                        tainted_early = our_taint(watch.drain() or {}) is not None
                        os.write(fd, _line("err", XID79))
                        t0 = time.perf_counter()
                        t1 = watch.wait(lambda n: our_taint(n) is not None, 240)
                        assert not tainted_early
                    else:
                        mid = _storm(fd, args.lines, args.seconds, at_middle=_line("err", XID79))
                        cpu1 = proc_cpu_s(agent.pid)
                        writes = _node_writes(env, req0)
                        assert mid is not None
                        t0 = mid
                        t1 = watch.wait(lambda n: our_taint(n) is not None, 240)
                finally:
                    os.close(fd)
                time.sleep(2.0)
                rss1 = proc_rss_kb(agent.pid)
                rows.append(
                    (trial, (t1 - t0) * 1000, cpu1 - cpu0, rss0 / 1024, rss1 / 1024, writes, args.lines)
                )
        finally:
            watch.stop()
            agent.stop()
        print(f"xid_storm  machine: {machine()}  apiserver: {env.version}")
        print(
            f"parameters: lines={args.lines} seconds={args.seconds:g} (Xid 13/31 alternating on one GPU, "
            f"dmesg --decode iso lines appended every {BATCH_S * 1000:.0f} ms) "
            f"intervals.gpu={args.gpu_interval:g}s "
            "snapshot=p5.48xlarge-healthy"
        )
        head = (
            f"{'fault at':>8} {'fault-to-taint ms':>18} {'CPU s (storm)':>14} {'CPU ms/1k lines':>16} "
            f"{'RSS before MiB':>15} {'RSS after MiB':>14} {'Node writes (storm)':>20}"
        )
        print(head)
        for trial, ms, cpu, r0, r1, writes, lines in rows:
            print(
                f"{trial:>8} {ms:>18.0f} {cpu:>14.2f} {cpu * 1000 / (lines / 1000):>16.2f} "
                f"{r0:>15.1f} {r1:>14.1f} {writes:>20}"
            )
        worst = max(r[1] for r in rows)
        growth = max(r[4] - r[3] for r in rows)
        per_k = max(r[2] * 1000 / (r[6] / 1000) for r in rows)
        print(
            f"targets: fault-to-taint <= 1000 ms {'met' if worst <= 1000 else 'MISSED'}; "
            f"Node writes <= 10 {'met' if max(r[5] for r in rows) <= 10 else 'MISSED'}; "
            f"RSS growth <= 16 MiB {'met' if growth <= 16 else 'MISSED'}; "
            f"CPU <= 10 ms/1k lines {'met' if per_k <= 10 else 'MISSED'}"
        )


if __name__ == "__main__":
    main()
