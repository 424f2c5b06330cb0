"""CPU time of one full `check` of an 8-GPU snapshot (read + parse every file, run every check, decide).

Usage: python -m bench.check_cpu [--snapshot DIR] [--runs N]
Prints per-phase CPU milliseconds (median, p95, max) over N runs after one warm-up run.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

from agent.checks.registry import CHECKS, run_checks
from agent.config import load_config_dir
from agent.core.results_doc import results_document
from agent.engine.verdict import decide
from agent.probes.snapshot import SnapshotSource
from agent.probes.source import gather_facts

DEFAULT = Path(__file__).resolve().parent.parent / "examples" / "snapshots" / "p5.48xlarge-xid79"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--snapshot", type=Path, default=DEFAULT)
    ap.add_argument("--runs", type=int, default=50)
    args = ap.parse_args()
    cfg = load_config_dir()
    phases: dict[str, list[float]] = {"read+parse": [], "checks": [], "verdict+json": [], "total": []}
    for i in range(args.runs + 1):
        t0 = time.process_time()
        source = SnapshotSource(args.snapshot)  # a fresh source: `check` parses every file once
        facts = gather_facts(source, cfg)
        t1 = time.process_time()
        results = run_checks(CHECKS, facts, cfg)
        t2 = time.process_time()
        results_document(
            decide(results), checked_at="x", boot_id=facts.boot_id, instance_type=facts.instance_type
        )
        t3 = time.process_time()
        if i == 0:
            continue  # warm-up: imports, regex compilation, page cache
        for name, value in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t3 - t0), strict=True):
            phases[name].append(value * 1000.0)
    print(
        f"snapshot: {args.snapshot}  runs: {args.runs}  "
        f"python {platform.python_version()}  {platform.machine()}"
    )
    print(f"{'phase':<14} {'median ms':>10} {'p95 ms':>8} {'max ms':>8}")
    for name, values in phases.items():
        print(f"{name:<14} {statistics.median(values):>10.2f} {pct(values, 0.95):>8.2f} {max(values):>8.2f}")


if __name__ == "__main__":
    main()
