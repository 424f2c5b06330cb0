"""`make demo`: judge the two bundled p5.48xlarge snapshots, healthy and after an Xid 79."""

from __future__ import annotations

from pathlib import Path

from agent.cli.main import main

SNAPSHOTS = Path(__file__).resolve().parents[2] / "examples" / "snapshots"  # a source checkout


def run() -> int:
    codes = []
    for name in ("p5.48xlarge-healthy", "p5.48xlarge-xid79"):
        print(f"\n$ gpu-healthcheck check --from-snapshot examples/snapshots/{name}")
        code = main(["check", "--from-snapshot", str(SNAPSHOTS / name)])
        print(f"(exit code {code})")
        codes.append(code)
    # The demo itself succeeds when the healthy node passes and the broken one fails.
    return 0 if codes == [0, 1] else 1


if __name__ == "__main__":
    raise SystemExit(run())
