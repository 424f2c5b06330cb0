"""`make demo-cluster`: the main job, end to end, on a local control plane.

It starts the test suite's real etcd + kube-apiserver (building it once, with progress shown),
installs `manifests/` as a user would, creates three GPU Nodes, and runs one snapshot-backed agent
per Node under the agent's own ServiceAccount (a token bound to its Node, fenced by the admission
policy). Then it writes an Xid 79 ("GPU has fallen off the bus") into one Node's kernel log and shows
what an operator sees: `kubectl get nodes -L …` before and after, the Node's Events and
`gpu-healthcheck status`. Everything it started is stopped at the end.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests/kubeenv and bench/_kube, when run as a script

from agent.core.node_keys import Keys  # noqa: E402
from bench._kube import AgentProcess, snapshot_copy, wait_for  # noqa: E402
from tests.kubeenv.binaries import KubeUnavailable, ensure_binaries  # noqa: E402

NODES = ("gpu-node-a", "gpu-node-b", "gpu-node-c")
BROKEN = "gpu-node-b"
NS, SA = "gpu-healthcheck", "gpu-healthcheck-agent"
XID79 = (
    "kern  :err   : 2025-01-21T03:12:44,118231+00:00 NVRM: Xid (PCI:0000:97:00): 79, "
    "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
)
KEYS = Keys()


def _step(out: TextIO, text: str) -> None:
    out.write(f"\n== {text}\n")
    out.flush()


def _show(out: TextIO, env: Any, *args: str) -> None:
    out.write(f"$ kubectl {' '.join(args)}\n")
    out.write(env.kubectl(*args, check=False).stdout)
    out.flush()


def _label(env: Any, node: str) -> str | None:
    status, body = env.request("GET", f"/api/v1/nodes/{node}")
    return (body.get("metadata", {}).get("labels") or {}).get(KEYS.status) if status == 200 else None


def _tainted(env: Any, node: str) -> bool:
    status, body = env.request("GET", f"/api/v1/nodes/{node}")
    return status == 200 and any(t.get("key") == KEYS.taint for t in body.get("spec", {}).get("taints") or ())


def run(env: Any, work: Path, out: TextIO = sys.stdout) -> dict[str, float]:
    """The demo on a started KubeEnv; returns its timings. Raises when the job is not done."""
    t0 = time.monotonic()
    _step(out, "install: kubectl apply --server-side -f manifests/")
    env.kubectl("apply", "--server-side", "-f", str(ROOT / "manifests"))
    config = work / "config"
    shutil.copytree(ROOT / "config", config)  # the ConfigMap's files, as the agent mounts them
    agents: list[AgentProcess] = []
    try:
        _step(out, f"three GPU Nodes, one agent each ({', '.join(NODES)})")
        for node in NODES:
            env.make_gpu_node(node, instance_type="p5.48xlarge", gpus=8)
            token = env.token_for(NS, SA, bound_node=node, expiration=3600, create=False)
            kubeconfig = env.kubeconfig_for_token(token, work / f"{node}.kubeconfig")
            snap = snapshot_copy(work / f"snap-{node}")
            agents.append(AgentProcess(env, node, snap, config, work / f"{node}.log", kubeconfig=kubeconfig))
        wait_for(lambda: all(_label(env, n) == "pass" for n in NODES), 90, "every Node judged pass")
        first = time.monotonic() - t0
        _show(out, env, "get", "nodes", "-L", f"{KEYS.status},{KEYS.severity}")

        _step(out, f"an Xid 79 on {BROKEN}: 'GPU has fallen off the bus' written to its kernel log")
        with (work / f"snap-{BROKEN}" / "kmsg.log").open("a") as fh:
            fh.write(XID79)
        t1 = time.monotonic()
        wait_for(lambda: _tainted(env, BROKEN), 30, f"{BROKEN} tainted")
        to_taint = time.monotonic() - t1
        out.write(f"(fault to taint: {to_taint:.2f} s)\n")
        _show(out, env, "get", "nodes", "-L", f"{KEYS.status},{KEYS.severity}")
        _show(out, env, "get", "events", "-n", "default", "--field-selector", f"involvedObject.name={BROKEN}")
        _step(out, "gpu-healthcheck status")
        _status(out, env)
        healthy = [n for n in NODES if n != BROKEN]
        if not all(_label(env, n) == "pass" and not _tainted(env, n) for n in healthy):
            raise RuntimeError("a healthy Node lost its pass label or gained a taint")
        return {"first_verdict_s": first, "fault_to_taint_s": to_taint}
    finally:
        for agent in agents:
            agent.stop()
        for node in NODES:
            env.delete_node(node)


def _status(out: TextIO, env: Any) -> None:
    import subprocess

    argv = [sys.executable, "-m", "agent.cli", "status", "--kubeconfig", str(env.kubeconfig)]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, check=False, timeout=60)
    out.write(proc.stdout + proc.stderr + f"(exit code {proc.returncode})\n")


def main(out: TextIO = sys.stdout, started: Callable[[], float] = time.monotonic) -> int:
    from tests.kubeenv.env import KubeEnv
    from tests.kubeenv.server import ControlPlane

    t0 = started()
    _step(out, "the local control plane (etcd + kube-apiserver, built from Go modules once)")
    try:
        binaries = ensure_binaries(build=True, out=sys.stderr)
    except KubeUnavailable as exc:
        out.write(f"{exc}\n")
        return 2
    plane = ControlPlane(binaries)
    plane.start()
    env = KubeEnv(plane)
    out.write(f"kube-apiserver {env.version} ready in {plane.start_seconds:.1f} s\n")
    try:
        with tempfile.TemporaryDirectory(prefix="gpuhc-demo-") as tmp:
            timings = run(env, Path(tmp), out)
    finally:
        env.stop()
    out.write(
        f"\ndone in {started() - t0:.0f} s (first verdicts {timings['first_verdict_s']:.1f} s after "
        f"install, fault to taint {timings['fault_to_taint_s']:.2f} s); everything it started is stopped\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
