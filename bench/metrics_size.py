"""Series and scrape size of one agent's /metrics (at most 60 series per agent, so that a
2,000-node fleet stays cheap to scrape and store).

A snapshot-backed agent runs every tier once, in process, on each bundled snapshot (healthy, and
after an Xid 79); its registry is rendered as Prometheus would scrape it. The live agent adds the
series of what it talks to: Node writes by kind and outcome (about 3 when healthy), the brake's
GPU-node count (2), the fence (1) and the GPU inventory read's latency (gpu_healthcheck_tool_seconds,
9 series for the one tool a healthy node reads: nvml, or nvidia-smi -q -x without NVML).

    python -m bench.metrics_size
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from prometheus_client import generate_latest

from agent.config import load_config_dir
from agent.engine.loop import Agent
from agent.probes.snapshot import SnapshotSource
from agent.reporters.metrics import Metrics

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOTS = ("p5.48xlarge-healthy", "p5.48xlarge-xid79")


def measure(snapshot: Path) -> tuple[int, int, Counter[str]]:
    metrics = Metrics()
    agent = Agent(
        SnapshotSource(snapshot),
        load_config_dir(),
        config_dir=None,
        writer=None,
        node_getter=None,
        kernel_path=None,
        kernel_is_device=False,
        metrics=metrics,
    )
    agent.run(once=True)
    text = generate_latest(metrics.registry).decode()
    series = [line for line in text.splitlines() if line and not line.startswith("#")]
    return len(series), len(text.encode()), Counter(s.split("{")[0].split(" ")[0] for s in series)


def main() -> None:
    print("metrics_size: one agent's /metrics after every tier ran once (in process, no API server)")
    for name in SNAPSHOTS:
        n, size, families = measure(ROOT / "examples" / "snapshots" / name)
        top = ", ".join(f"{k.removeprefix('gpu_healthcheck_')} {v}" for k, v in families.most_common(4))
        print(f"  {name:<22} {n:>3} series, {size:>5} bytes per scrape  (largest: {top})")


if __name__ == "__main__":
    main()
