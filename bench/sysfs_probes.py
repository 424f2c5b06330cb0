"""The sysfs probes of the topology tier: PCI bus, CPU/NUMA lists, and their checks, per read.

Usage: python -m bench.sysfs_probes [--runs 50]

Builds the 8x H100 + ConnectX-7 node's PCI bus from its real `lspci -vvv` (tests/pci_sysfs_tree.py:
114 functions after the CPU's own, link and AER files) and the H100 VM's full bus (7 functions) in a
temporary directory, then times `read_pci` and the three pci checks (CPU time, process_time), and
`read_host`. A real /sys serves the same reads from memory; a tmpfs/disk tree here is an upper bound
of the file work.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from agent.checks.pci import check_aer, check_inventory, check_link
from agent.config import parse_config
from agent.core.facts import NodeFacts
from agent.probes.host import read_host
from agent.probes.pci import read_pci
from tests.pci_sysfs_tree import build_from_capture, build_from_lspci
from tests.test_host import system_tree


def timed(fn: Callable[[], object], runs: int) -> tuple[float, float]:
    took = []
    for _ in range(runs):
        t0 = time.process_time()
        fn()
        took.append((time.process_time() - t0) * 1000)
    took.sort()
    return statistics.median(took), took[int(0.95 * (len(took) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=50)
    runs = parser.parse_args().runs
    cfg = parse_config({}, None, None)
    with tempfile.TemporaryDirectory() as tmp:
        x8 = build_from_lspci(Path(tmp) / "x8")
        vm = build_from_capture(Path(tmp) / "vm")
        host = system_tree(Path(tmp) / "host") / "devices" / "system"
        sample = read_pci(x8)
        facts = NodeFacts(pci=sample, pci_previous=sample)
        rows = [
            ("read_pci, 8x H100 node", lambda: read_pci(x8)),
            ("read_pci, H100 VM", lambda: read_pci(vm)),
            (
                "pci checks, 8x H100 node",
                lambda: [c(facts, cfg) for c in (check_inventory, check_link, check_aer)],
            ),
            ("read_host", lambda: read_host(host)),
        ]
        print(f"sysfs_probes  runs: {runs}  functions on the 8x H100 bus: {len(sample.devices)}")
        print(f"{'step':<28} {'median ms':>10} {'p95 ms':>8}")
        for label, fn in rows:
            med, p95 = timed(fn, runs)
            print(f"{label:<28} {med:>10.2f} {p95:>8.2f}")


if __name__ == "__main__":
    main()
