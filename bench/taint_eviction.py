"""Taint to pods gone: the agent's NoExecute taint → kube-controller-manager's taint-eviction controller.

Usage: python -m bench.taint_eviction [--trials 5] [--toleration-seconds 4]

A control plane of its own (tests/kubeenv/eviction.py): etcd + kube-apiserver with the audit log on,
kube-controller-manager running the taint-eviction controller (with node-lifecycle). Per trial
(tests/eviction_scenario.py): two fresh GPU Nodes, each with a pod without toleration, one tolerating
our taint, one tolerating it for --toleration-seconds, and one per DaemonSet of manifests/; the REAL
agent process on each (the docs' `taintEffectBySeverity`: reboot and isolate NoExecute), one healthy
until an Xid 79 line is appended to its kernel log, one whose nvidia-smi output is unreadable
(verdict unknown). Figures are the API server's own audit timestamps: from the completion of the
agent's PATCH that added the taint to the completion of the controller's DELETE of each pod (no
kubelet runs: "gone" = the deletion was accepted, the pod Terminating with DisruptionTarget
DeletionByTaintManager). Also counted: pods that stayed, and any delete/eviction by the agent.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from bench._kube import ROOT, machine, pct  # noqa: F401  (ROOT puts the repository on sys.path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--toleration-seconds", type=int, default=4)
    args = ap.parse_args()

    from tests import eviction_scenario as scenario
    from tests.kubeenv.binaries import KubeUnavailable, find_binaries, unavailable_message
    from tests.kubeenv.eviction import eviction_cluster

    try:
        binaries = find_binaries()
    except KubeUnavailable as exc:
        raise SystemExit(unavailable_message(str(exc))) from exc
    if binaries is None:
        raise SystemExit(unavailable_message("no binaries in .cache/kube-bins"))

    plain: list[float] = []
    timed: list[float] = []
    stayed_wrongly = 0
    print(f"taint_eviction: {args.trials} trials, tolerationSeconds={args.toleration_seconds}; {machine()}")
    with tempfile.TemporaryDirectory(prefix="bench-evict-") as tmp, eviction_cluster(binaries) as cluster:
        for trial in range(args.trials):
            o = scenario.run(cluster, Path(tmp) / f"t{trial}", args.toleration_seconds)
            p, t = (
                o.seconds_after_taint(o.pod(o.broken, "plain")),
                o.seconds_after_taint(o.pod(o.broken, "timed")),
            )
            if p is None or t is None:
                raise SystemExit(f"trial {trial}: no figure (taint at {o.taint_at}, deletes {o.evicted_at})")
            plain.append(p)
            timed.append(t)
            stay = [n for n, (_, k) in o.pods.items() if k not in ("plain", "timed") or n.startswith(o.blind)]
            stayed_wrongly += sum(o.evicted[n] for n in stay)
            print(f"  trial {trial + 1}: no toleration {p * 1000:.0f} ms, tolerationSeconds {t:.3f} s")
        writes = cluster.agent_writes()
        agent_deletes = [e for e in writes if e.verb.startswith("delete") or e.subresource == "eviction"]
    print()
    print("| pod | median | p90 | max |")
    print("|---|---|---|---|")
    for name, xs in (("no toleration", plain), (f"tolerationSeconds={args.toleration_seconds}", timed)):
        print(f"| {name} | {statistics.median(xs):.3f} s | {pct(xs, 0.9):.3f} s | {max(xs):.3f} s |")
    print(f"\npods that should have stayed but were evicted: {stayed_wrongly}")
    print(f"agent writes in the audit log: {len(writes)}, deletes or evictions: {len(agent_deletes)}")


if __name__ == "__main__":
    main()
