"""API writes of node.remediationConditions: per fault and in steady state, with 0 and with N entries.

Usage: python -m bench.remediation_writes [--entries 3] [--gpu-interval 2] [--steady-seconds 60]

A real etcd + kube-apiserver, one GPU Node per run, one agent process on a copy of the healthy
p5.48xlarge snapshot (`intervals.gpu` shortened, brake off). Two runs: without remediation entries
(the shipped config) and with --entries of them. Per run: after the first verdict and a warm-up, the
API server's own `apiserver_request_total` (nodes, nodes/status, events) over --steady-seconds of a
healthy node; then one Xid 79 appended to the kernel log, and the requests from just before the
append until the entries show the unhealthy status (or, without entries, the taint) plus three gpu
cycles: the writes one fault costs. Then the same while the node recovers (a clear by annotation).
Nothing else touches Nodes or Events during the windows.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from agent.core.node_keys import Keys
from bench._kube import (
    XID_LINE,
    AgentProcess,
    apiserver_requests,
    core_api,
    diff,
    kube_env,
    machine,
    our_taint,
    snapshot_copy,
    wait_for,
    write_config,
)

K = Keys()


def config(gpu: float, entries: int) -> str:
    text = f"intervals:\n  gpu: {gpu:g}\n  efa: 300\n  topology: 300\nnode:\n  maxTaintedFraction: 1\n"
    if entries:
        text += "  remediationConditions:\n" + "".join(
            f"    - type: BenchRemediation{i}\n" for i in range(entries)
        )
    return text


def conditions(env: Any, node: str) -> dict[str, str]:
    status, body = env.request("GET", f"/api/v1/nodes/{node}")
    assert status == 200
    return {c["type"]: c["status"] for c in body["status"].get("conditions") or ()}


def writes(got: dict[tuple[str, str, str], float]) -> str:
    keep = {k: v for k, v in got.items() if k[1] in ("PATCH", "PUT", "POST", "CREATE", "UPDATE")}
    return ", ".join(f"{r} {v} {c}: {n:.0f}" for (r, v, c), n in sorted(keep.items())) or "none"


def total(got: dict[tuple[str, str, str], float], resource: str) -> float:
    return sum(n for (r, v, _), n in got.items() if r == resource and v in ("PATCH", "PUT", "POST"))


def one_run(env: Any, work: Path, gpu: float, entries: int, steady_s: float) -> dict[str, Any]:
    node = f"bench-remediation-{entries}"
    env.make_gpu_node(node, instance_type="p5.48xlarge", gpus=8)
    core = core_api(env)
    env.ensure_namespace("gpu-healthcheck")  # the repair budget's records, as manifests/ has it
    snap = snapshot_copy(work / f"snap-{entries}")
    cfg = write_config(work / f"config-{entries}", config(gpu, entries))
    agent = AgentProcess(env, node, snap, cfg, work / f"agent-{entries}.log")
    types = [f"BenchRemediation{i}" for i in range(entries)]
    try:
        wait_for(lambda: (core.read_node(node).metadata.labels or {}).get(K.status) == "pass", 60, "pass")
        time.sleep(3 * gpu + 3)  # warm-up: the first writes and Events are done
        a0 = apiserver_requests(env)
        time.sleep(steady_s)
        steady = diff(apiserver_requests(env), a0)

        a0 = apiserver_requests(env)
        with (snap / "kmsg.log").open("a") as fh:
            fh.write(XID_LINE)
        if types:
            wait_for(lambda: all(conditions(env, node).get(t) == "False" for t in types), 30, "unhealthy")
        else:
            wait_for(lambda: our_taint(env.request("GET", f"/api/v1/nodes/{node}")[1]), 30, "taint")
        time.sleep(3 * gpu)
        fault = diff(apiserver_requests(env), a0)

        a0 = apiserver_requests(env)
        env.request(
            "PATCH",
            f"/api/v1/nodes/{node}",
            {"metadata": {"annotations": {K.clear_latched: "all"}}},
            content_type="application/merge-patch+json",
        )
        wait_for(lambda: our_taint(env.request("GET", f"/api/v1/nodes/{node}")[1]) is None, 30, "untaint")
        if types:
            wait_for(lambda: all(conditions(env, node).get(t) == "True" for t in types), 30, "healthy")
        time.sleep(3 * gpu)
        recovery = diff(apiserver_requests(env), a0)
    finally:
        agent.stop()
    return {"steady": steady, "fault": fault, "recovery": recovery, "steady_s": steady_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--entries", type=int, default=3, help="remediation conditions in the second run")
    ap.add_argument("--gpu-interval", type=float, default=2.0, help="intervals.gpu in seconds")
    ap.add_argument("--steady-seconds", type=float, default=60.0, help="healthy window per run")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-remediation-") as tmp, kube_env() as env:
        runs = {
            n: one_run(env, Path(tmp), args.gpu_interval, n, args.steady_seconds) for n in (0, args.entries)
        }
        version = env.version
    print(f"remediation_writes  machine: {machine()}  apiserver: {version}")
    print(
        f"parameters: intervals.gpu={args.gpu_interval:g}s  steady window={args.steady_seconds:g}s "
        f"({args.steady_seconds / args.gpu_interval:.0f} gpu cycles)  entries: 0 and {args.entries}"
    )
    head = f"{'entries':>7} {'phase':<9} {'nodes':>5} {'nodes/status':>12} {'events':>6}  all writes"
    print(head)
    for n, run in runs.items():
        for phase in ("steady", "fault", "recovery"):
            got = run[phase]
            print(
                f"{n:>7} {phase:<9} {total(got, 'nodes'):>5.0f} {total(got, 'nodes/status'):>12.0f} "
                f"{total(got, 'events'):>6.0f}  {writes(got)}"
            )
    extra = {
        phase: total(runs[args.entries][phase], "nodes/status") - total(runs[0][phase], "nodes/status")
        for phase in ("steady", "fault", "recovery")
    }
    print(
        f"status PATCHes added by {args.entries} entries: steady {extra['steady']:.0f}, "
        f"fault {extra['fault']:.0f}, recovery {extra['recovery']:.0f} "
        f"(target: 0 in steady state, at most one status PATCH per fault for all conditions together)"
    )


if __name__ == "__main__":
    main()
