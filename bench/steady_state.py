"""Steady-state cost of a healthy node: API requests by verb (counted at the API server) and Node writes.

Usage: python -m bench.steady_state [--minutes 3] [--gpu-interval 5] [--dra-only]

A real etcd + kube-apiserver, one GPU Node, one agent process on the healthy p5.48xlarge snapshot.
After the first verdict and a warm-up, the benchmark reads the API server's `apiserver_request_total`
(its own /metrics, admin client) for resources nodes and events, waits --minutes, reads it again, and
prints the difference by resource, verb and code; also the agent's `gpu_healthcheck_node_writes_total`
(its metrics port) and its tier runs. Nothing else touches Nodes or Events during the window (the
benchmark only GETs /metrics, a non-resource URL), so the counts are the agent's, plus any the API
server makes itself (a "no agent" baseline of the same length is measured first to show them).

Intervals are shortened (gpu --gpu-interval s; efa and topology 5x that, the default 1:5 ratio) so a
short window holds many cycles. Figures are given three ways: measured in the window; per gpu cycle;
and per node-hour at the default 60 s gpu interval = per-cycle x 60 for tier-driven requests. A WATCH
is a long-running request whose count does not follow the tiers (the agent's watch ends after 300 s
and is re-opened): its per-hour figure is wall-clock (measured count x 3600 / window).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from agent.core.node_keys import CANARY, Keys
from agent.core.results_doc import CONFIG_FIELD
from bench._kube import (
    AgentProcess,
    apiserver_requests,
    core_api,
    diff,
    free_port,
    kube_env,
    longrunning_watches,
    machine,
    metric_sum,
    snapshot_copy,
    wait_for,
    write_config,
)
from tests.kubeenv.dra import APISERVER_ARGS, resource_slice


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=3.0, help="measurement window (>= 10 for the full run)")
    ap.add_argument("--gpu-interval", type=float, default=5.0, help="intervals.gpu in seconds (default 60)")
    ap.add_argument("--baseline-seconds", type=float, default=30.0, help="no-agent window first (0 = skip)")
    ap.add_argument(
        "--canary",
        action="store_true",
        help="the Node labelled gpu-healthcheck/config=canary, the agent on a canary ConfigMap directory",
    )
    ap.add_argument(
        "--isolation",
        choices=("node", "gpu", "auto"),
        default="node",
        help="node.isolation; gpu|auto: the API server with the flags that serve DeviceTaintRules on its "
        "version (tests/kubeenv/dra.py) and the driver's ResourceSlice",
    )
    ap.add_argument(
        "--dra-only",
        action="store_true",
        help="a DRA-only Node: no nvidia.com/gpu, the driver's ResourceSlice (the stock API server)",
    )
    ap.add_argument(
        "--validating",
        action="store_true",
        help="the Node registered with gpu-healthcheck/validating:NoSchedule (--register-with-taints)",
    )
    args = ap.parse_args()
    window = args.minutes * 60
    gates = args.isolation != "node"  # device taints: the DRA gates
    dra = gates or args.dra_only
    resources = ("nodes", "events", *(("resourceslices", "devicetaintrules", "deviceclasses") if dra else ()))
    with (
        tempfile.TemporaryDirectory(prefix="bench-steady-") as tmp,
        kube_env(APISERVER_ARGS if gates else None) as env,
    ):
        work = Path(tmp)
        node = "bench-steady-node"
        startup = [{"key": Keys().validating, "effect": "NoSchedule"}] if args.validating else []
        gpus = None if args.dra_only else 8  # DRA-only: no device plugin, no nvidia.com/gpu
        env.make_gpu_node(node, instance_type="p5.48xlarge", gpus=gpus, taints=startup)
        core = core_api(env)
        if dra:  # the DRA driver's slice of this node's 8 GPUs (tests/kubeenv/dra.py)
            code, body = env.request("POST", "/apis/resource.k8s.io/v1/resourceslices", resource_slice(node))
            assert code == 201, body

        baseline: dict[tuple[str, str, str], float] = {}
        watches_before = longrunning_watches(env)
        if args.baseline_seconds > 0:
            b0 = apiserver_requests(env, resources)
            time.sleep(args.baseline_seconds)
            baseline = diff(apiserver_requests(env, resources), b0)

        snap = snapshot_copy(work / "snap")
        g = args.gpu_interval
        cfg = write_config(
            work / "config",
            f"intervals:\n  gpu: {g:g}\n  efa: {5 * g:g}\n  topology: {5 * g:g}\n"
            f"node:\n  isolation: {args.isolation}\n",
        )
        port = free_port()
        extra: list[str] = []
        if args.canary:  # the same config, read from the canary directory while the Node asks for it
            canary = write_config(work / "canary", (cfg / "config.yaml").read_text())
            core.patch_node(node, {"metadata": {"labels": {Keys().config_channel: CANARY}}})
            extra = ["--canary-config-dir", str(canary)]
        agent = AgentProcess(env, node, snap, cfg, work / "agent.log", metrics_port=port, extra=extra)
        try:
            wait_for(
                lambda: (core.read_node(node).metadata.labels or {}).get(Keys().status) == "pass",
                60,
                "first verdict",
            )
            if args.validating:  # the first complete pass lifts it; measured after that
                keys = lambda: [t.key for t in core.read_node(node).spec.taints or []]  # noqa: E731
                wait_for(lambda: Keys().validating not in keys(), 60, "the validating taint lifted")
            # Warm-up: the first writes and Events, and the one write after the second efa run (its
            # message changes from "no previous sample" to counter rates), are done.
            time.sleep(6 * g + 5)
            a0, m0, t0 = apiserver_requests(env, resources), agent.metrics(), time.monotonic()
            time.sleep(window)
            a1, m1, t1 = apiserver_requests(env, resources), agent.metrics(), time.monotonic()
            open_watches = longrunning_watches(env)
            slice_watches = longrunning_watches(env, "resourceslices") if dra else 0.0
        finally:
            agent.stop()
        measured = t1 - t0
        got = diff(a1, a0)
        cycles = metric_sum(m1, "gpu_healthcheck_tier_duration_seconds_count{tier=gpu") - metric_sum(
            m0, "gpu_healthcheck_tier_duration_seconds_count{tier=gpu"
        )
        writes = {
            k.split("{", 1)[1].rstrip("}"): m1[k] - m0.get(k, 0.0)
            for k in m1
            if k.startswith("gpu_healthcheck_node_writes_total{")
        }
        print(f"steady_state  machine: {machine()}  apiserver: {env.version}")
        if args.validating:
            print(
                f"validating: the Node registered with {Keys().validating}:NoSchedule, lifted before "
                "the window"
            )
        if args.canary:
            results = (core.read_node(node).metadata.annotations or {}).get(Keys().results) or "{}"
            in_force = json.loads(results).get(CONFIG_FIELD)
            print(f"canary: the Node labelled {Keys().config_channel}={CANARY}; config in force: {in_force}")
        print(
            f"parameters: isolation={args.isolation}{'  dra-only' if args.dra_only else ''}  "
            f"window={measured:.0f}s  "
            f"intervals gpu={g:g}s efa={5 * g:g}s topology={5 * g:g}s  "
            f"gpu cycles in window={cycles:.0f}  "
            f"scale to the default 60 s gpu interval: x{60 / g:g} (tier-driven)"
        )
        if args.baseline_seconds > 0:
            base = ", ".join(f"{r} {v} {c}: {n:.0f}" for (r, v, c), n in sorted(baseline.items())) or "none"
            print(f"baseline without agent ({args.baseline_seconds:.0f}s, {'/'.join(resources)}): {base}")
        head = f"{'resource':<14} {'verb':<8} {'code':<5} {'in window':>9} {'per cycle':>9}"
        print(f"{head} {'per node-hour':>14}")
        if not got:
            print(f"{'nodes/events':<14} {'(any)':<8} {'':<5} {0:>9} {0:>9.2f} {0:>14.1f}")
        for (res, verb, code), n in sorted(got.items()):
            per_cycle = n / cycles if cycles else 0.0
            per_hour = n * 3600 / measured if verb == "WATCH" else per_cycle * 60
            note = " (wall clock)" if verb == "WATCH" else ""
            print(f"{res:<14} {verb:<8} {code:<5} {n:>9.0f} {per_cycle:>9.2f} {per_hour:>14.1f}{note}")
        polling = sum(n for (_, v, _), n in got.items() if v in ("GET", "LIST"))
        mutating = sum(n for (_, v, _), n in got.items() if v in ("PATCH", "PUT", "POST", "UPDATE", "CREATE"))
        print(
            f"open WATCHes on nodes: {watches_before:.0f} before the agent (the API server's own), "
            f"{open_watches:.0f} at the end of the window"
        )
        if dra:
            print(f"open WATCHes on resourceslices at the end of the window: {slice_watches:.0f}")
        agent_writes = {k: v for k, v in writes.items() if v}
        print(f"agent gpu_healthcheck_node_writes_total in window: {agent_writes or 'none (0)'}")
        print(
            f"target 0 writes and no polling reads: writes={mutating:.0f} reads(GET/LIST)={polling:.0f} -> "
            f"{'met' if not mutating and not polling else 'MISSED'}"
        )


if __name__ == "__main__":
    main()
