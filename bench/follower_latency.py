"""The kernel-log follower alone: a record written → the follower wakes the engine.

Usage: python -m bench.follower_latency [--trials 60] [--compare OLD_CHECKOUT]

No API server: the real KernelTail and KernelFollower of a checkout, in a child process started in
that checkout (so that --compare measures the old code's follower in the same run), on
- fifo: a FIFO standing in for /dev/kmsg (non-blocking reads, poll(2); records in /dev/kmsg's format);
- file: a snapshot's kmsg.log that grows (the Xid line is appended).
Per trial: a reboot record (FIFO) or a rewritten log (file), then 0.7 s of quiet (the follower is idle,
as on a healthy node), then one Xid 79; the time from the end of the write to the follower's call of
its trigger (time.perf_counter in the child). bench/fault_to_taint adds the xid tier, the verdict, the
Node write and the watch to this.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from bench._kube import ROOT, machine, pct

CHILD = r"""
import json, os, sys, tempfile, threading, time
from agent.probes.kernel_follow import KernelFollower
from agent.probes.kernel_tail import KernelTail

mode, trials = sys.argv[1], int(sys.argv[2])
XID = "NVRM: Xid (PCI:0000:97:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
LINE = "kern  :err   : 2025-01-21T03:12:44,118231+00:00 " + XID + "\n"
HEALTHY = "kern  :info  : 2025-01-21T03:12:40,000001+00:00 eth0: link up\n"
d = tempfile.mkdtemp()
path = os.path.join(d, "kmsg.log")
if mode == "fifo":
    os.mkfifo(path)
    w = os.open(path, os.O_RDWR)
    os.write(w, b"6,0,0,-;Linux version 6.8.0\n")
else:
    open(path, "w").write(HEALTHY)
tail = KernelTail(path, device=mode == "fifo")
woke = threading.Event()
at = [0.0]
def trigger():
    at[0] = time.perf_counter()
    woke.set()
follower = KernelFollower(tail, trigger)
follower.start()
woke.wait(10)
out = []
for i in range(trials):
    if mode == "fifo":
        os.write(w, b"6,0,0,-;Linux version 6.8.0\n")  # a reboot: the sequence starts again
    else:
        open(path, "w").write(HEALTHY)  # a reboot: the log rewritten
    time.sleep(0.7 + (i % 7) * 0.013)  # idle, as on a healthy node; not in step with a poll
    woke.clear()
    if mode == "fifo":
        t0 = time.perf_counter()
        os.write(w, ("3,1,5000000,-;" + XID + "\n").encode())
    else:
        with open(path, "a") as fh:
            fh.write(LINE)
            fh.flush()
        t0 = time.perf_counter()
    if not woke.wait(10):
        raise SystemExit("the follower did not wake in 10 s")
    out.append((at[0] - t0) * 1000)
follower.stop()
print(json.dumps(out))
"""


def measure(root: Path, mode: str, trials: int) -> list[float]:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(trials)],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{root} ({mode}): {proc.stderr[-2000:]}")
    values: list[float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return values


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=60)
    ap.add_argument("--compare", type=Path, metavar="DIR", help="also measure the follower of this checkout")
    args = ap.parse_args()
    checkouts = [("new", ROOT)] + ([("old", args.compare.resolve())] if args.compare else [])
    print(f"follower_latency  machine: {machine()}  trials={args.trials} per agent and mode")
    print(f"{'agent':<6} {'kmsg':<5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for mode in ("fifo", "file"):
        for label, root in checkouts:
            ms = measure(root, mode, args.trials)
            print(f"{label:<6} {mode:<5} {pct(ms, 0.5):>8.1f} {pct(ms, 0.99):>8.1f} {max(ms):>8.1f}")


if __name__ == "__main__":
    main()
