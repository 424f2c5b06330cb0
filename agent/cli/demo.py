"""`make demo`: judge the bundled p5.48xlarge snapshots: healthy, after an Xid 79, and a healthy
DRA-only node (no device plugin: its GPUs compared with NVIDIA's DRA driver's ResourceSlice)."""

from __future__ import annotations

from pathlib import Path

from agent.cli.main import main

SNAPSHOTS = Path(__file__).resolve().parents[2] / "examples" / "snapshots"  # a source checkout


def run() -> int:
    codes = []
    for name in ("p5.48xlarge-healthy", "p5.48xlarge-xid79", "p5.48xlarge-dra"):
        print(f"\n$ gpu-healthcheck check --from-snapshot examples/snapshots/{name}")
        code = main(["check", "--from-snapshot", str(SNAPSHOTS / name)])
        print(f"(exit code {code})")
        codes.append(code)
    # The demo itself succeeds when the healthy nodes pass and the broken one fails.
    return 0 if codes == [0, 1, 0] else 1


if __name__ == "__main__":
    raise SystemExit(run())
