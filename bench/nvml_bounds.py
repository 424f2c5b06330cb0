"""CPU added to a healthy gpu cycle by reading each GPU within its own bound (agent/probes/nvml.py),
against the old way (every GPU in the read's one worker), alternated in one run.

Usage: python -m bench.nvml_bounds [--rounds 10] [--reads 20]
The machine is the fake libnvidia-ml.so.1 of the tests (built with gcc into .cache/), loaded under its
soname before the real pynvml, its GPUs the real 8x H100 recording gpud-h100x8-535.183.01: the
figures are the agent's own Python and threading cost over a library that answers at once, not the
driver's. Per round, --reads inventory reads each way, the order of the two ways alternating by
round; CPU is the process's user+sys (all threads) around those reads. Prints the per-read CPU
(median and spread over rounds), the difference and the ratio, the wall per read, and the machine's
load (loadavg, CPUs), since timings on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def cpu() -> float:
    """user + sys of every thread of this process (CLOCK_PROCESS_CPUTIME_ID)."""
    return time.process_time()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--reads", type=int, default=20)
    args = ap.parse_args()

    from tests.conftest import build_fake_libnvml
    from tests.fakes.nvml.fake_nvml import FakeLib, from_recordings

    conf = Path(tempfile.mkdtemp()) / "fake-nvml.conf"
    lib = FakeLib(build_fake_libnvml() / "libnvidia-ml.so.1", conf)
    os.environ["FAKE_NVML_CONFIG"] = str(conf)
    lib.write(from_recordings(ROOT / "tests" / "fixtures" / "nvidia-smi-q" / "gpud-h100x8-535.183.01.txt"))

    from agent.probes.nvml import read_nvml

    ways = {"per-GPU bounds": True, "one worker (old)": False}
    for per_gpu in ways.values():  # warm-up: imports, nvmlInit, attaches
        assert len(read_nvml(10, per_gpu_bounds=per_gpu).gpus) == 8
    cpu_ms: dict[str, list[float]] = {w: [] for w in ways}
    wall_ms: dict[str, list[float]] = {w: [] for w in ways}
    load_before = os.getloadavg()
    for r in range(args.rounds):
        order = list(ways) if r % 2 == 0 else list(reversed(ways))
        for way in order:
            c0, w0 = cpu(), time.perf_counter()
            for _ in range(args.reads):
                read_nvml(10, per_gpu_bounds=ways[way])
            cpu_ms[way].append(1000 * (cpu() - c0) / args.reads)
            wall_ms[way].append(1000 * (time.perf_counter() - w0) / args.reads)
    load_after = os.getloadavg()
    print(
        f"8 GPUs (fake libnvidia-ml, gpud-h100x8 recording), {args.rounds} rounds x {args.reads} reads each "
        f"way, alternated; python {platform.python_version()} {platform.machine()}, "
        f"{os.cpu_count()} CPUs, loadavg {load_before[0]:.2f} before / {load_after[0]:.2f} after"
    )
    print(f"{'way':<18} {'CPU ms/read (median)':>21} {'min':>7} {'max':>7} {'wall ms/read':>13}")
    for way in ways:
        c = cpu_ms[way]
        print(
            f"{way:<18} {statistics.median(c):>21.3f} {min(c):>7.3f} {max(c):>7.3f} "
            f"{statistics.median(wall_ms[way]):>13.3f}"
        )
    new, old = (statistics.median(cpu_ms[w]) for w in ways)
    print(f"added by per-GPU bounds: {new - old:+.3f} CPU ms per read (ratio {new / old:.2f})")


if __name__ == "__main__":
    main()
