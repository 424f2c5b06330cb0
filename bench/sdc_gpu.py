"""The SDC probe on a lent GPU machine: the torch backend run twice on every GPU, every digest equal
across the two runs and across the GPUs (no false `warn` on a healthy node), and its wall time.

Usage (repository root; needs torch with CUDA, nothing of the agent's):
    python3 bench/sdc_gpu.py [--size 4096] [--repeats 1] [--out DIR]

Exit 0 when both runs completed with one attempt each, no GPU errored, and the two runs' digests
are equal per GPU, kernel and precision; 1 otherwise, saying which. With one GPU only the run-to-run
comparison is made (consensus needs siblings). --out DIR also writes both reports and the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sdcprobe.backend import PRECISIONS  # noqa: E402
from sdcprobe.probe import Plan, run_probe  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from sdcprobe.torch_backend import TorchBackend

    plan = Plan(size=args.size, precisions=PRECISIONS)
    reports, walls = [], []
    for _ in range(2):
        started = time.monotonic()
        reports.append(run_probe(TorchBackend(repeats=args.repeats), plan))
        walls.append(round(time.monotonic() - started, 2))
    problems: list[str] = []
    for n, r in enumerate(reports, 1):
        if len(r["attempts"]) != 1:
            problems.append(
                f"run {n}: a disagreement re-ran: {r['attempts'][0]['differed']} {r['attempts'][0]['split']}"
            )
        for dev, err in r["attempts"][0]["errors"].items():
            problems.append(f"run {n}: GPU {dev} errored: {err}")
    first, second = (r["attempts"][0]["digests"] for r in reports)
    for dev in sorted(set(first) | set(second)):
        for key in sorted(set(first.get(dev, {})) | set(second.get(dev, {}))):
            if first.get(dev, {}).get(key) != second.get(dev, {}).get(key):
                problems.append(f"GPU {dev} {key}: the two runs differ")
    figures = {
        "devices": [d["name"] for d in reports[0]["devices"]],
        "precisions": reports[0]["devices"][0]["precisions"] if reports[0]["devices"] else [],
        "wall_s": walls,
        "probe_s": [r["seconds"] for r in reports],
        "per_gpu_s": [r["attempts"][0]["seconds"] for r in reports],
        "size": args.size,
        "repeats": args.repeats,
        "problems": problems,
    }
    print(json.dumps(figures, indent=1))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        for n, r in enumerate(reports, 1):
            (args.out / f"sdc-run-{n}.json").write_text(json.dumps(r, indent=1, sort_keys=True))
        (args.out / "sdc_gpu.json").write_text(json.dumps(figures, indent=1))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
