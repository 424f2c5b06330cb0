"""Warnings before a fault: the results annotation's size and the gpu cycle's CPU with the trend reads.

Usage: python -m bench.trend_annotation [--cycles 300]

1. Size of the `results` annotation (compact JSON, the 16 KiB limit) on an 8x H100 node
   (tests/trend_scenario.py: the p5.48xlarge snapshot read by read, one read kept per spacing):
   healthy with `keepReads` reads kept, and with every warning on every GPU (7 rules x 8 GPUs; the
   retired-pages rule is for GPUs before Ampere, which never sit beside H100s). Also the size before
   results_doc.fit (what would be written with no limit): equal means nothing was cut.
2. CPU (process_time) of one gpu-tier run + evaluate + fingerprint, median over --cycles cycles, on
   the healthy snapshot with one read kept and with `keepReads` kept, and on the every-warning node.
   Compare with bench/footprint's run_tier(gpu) + evaluate+fingerprint, run on the same machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import agent.core.results_doc as results_doc
from agent.engine.engine import Engine
from agent.engine.write_policy import fingerprint
from bench._kube import machine
from tests.trend_scenario import Node


def sizes(node: Node) -> tuple[int, int, dict[str, Any]]:
    """The annotation as written, and as it would be with no size limit."""
    _, marks = node.engine.evaluate()
    fit, unlimited = results_doc.fit, results_doc.MAX_RESULTS_BYTES
    results_doc.fit = lambda doc, limit=unlimited: fit(doc, 10**9)  # type: ignore[assignment]
    try:
        _, whole = node.engine.evaluate()
    finally:
        results_doc.fit = fit  # type: ignore[assignment]
    return len(marks.results_json.encode()), len(whole.results_json.encode()), json.loads(marks.results_json)


def cpu_ms(engine: Engine, cycles: int, wall: list[float], step: float) -> float:
    times = []
    for _ in range(cycles):
        wall[0] += step
        t0 = time.process_time()
        engine.run_tier("gpu")
        _, marks = engine.evaluate()
        fingerprint(marks)
        times.append((time.process_time() - t0) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cycles", type=int, default=300)
    args = ap.parse_args()
    print(f"trend_annotation  machine: {machine()}")
    with tempfile.TemporaryDirectory(prefix="bench-trend-") as tmp:
        rows = []
        for label, worn in (("healthy", False), ("every warning, every GPU", True)):
            node = Node(Path(tmp) / label.split()[0], worn=worn)
            keep = node.cfg.trends.keep_reads
            for _ in range(keep):
                node.read()
            written, whole, doc = sizes(node)
            warned = sum(len(s) for g in doc["gpus"] for s in (g.get("warnings") or {}).values())
            rows.append((label, written, whole, len(doc["trends"]["t"]), warned, node))
        print(f"\n1. results annotation, 8 GPUs, {keep} reads kept (limit {results_doc.MAX_RESULTS_BYTES} B)")
        print(f"{'node':<26} {'written B':>10} {'no limit B':>11} {'reads':>6} {'warnings':>9}")
        for label, written, whole, reads, warned, _ in rows:
            print(f"{label:<26} {written:>10} {whole:>11} {reads:>6} {warned:>9}")

        print(f"\n2. CPU of gpu tier + evaluate + fingerprint, median of {args.cycles} cycles (ms)")
        healthy = Node(Path(tmp) / "cpu", worn=False)
        healthy.read()  # one read kept; files unchanged from here on (parses are memoised, as live)
        wall = [float(healthy.now)]
        healthy.engine.wall = lambda: wall[0]
        one = cpu_ms(healthy.engine, args.cycles, wall, 1.0)  # within the spacing: nothing kept
        while len(healthy.engine.state.trends.reads) < healthy.cfg.trends.keep_reads:
            wall[0] += healthy.cfg.trends.read_spacing_s
            healthy.engine.run_tier("gpu")
        full = cpu_ms(healthy.engine, args.cycles, wall, 60.0)  # a gpu cycle a minute: a read kept every 15
        worn = rows[1][5]
        wall_w = [float(worn.now)]
        worn.engine.wall = lambda: wall_w[0]
        warn = cpu_ms(worn.engine, args.cycles, wall_w, 60.0)
        print(f"{'healthy, 1 read kept':<34} {one:>6.2f}")
        print(f"{'healthy, ' + str(healthy.cfg.trends.keep_reads) + ' reads kept':<34} {full:>6.2f}")
        print(f"{'every warning, every GPU':<34} {warn:>6.2f}")


if __name__ == "__main__":
    main()
