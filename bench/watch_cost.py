"""What one agent's open watches cost the API server: memory held per watch, CPU per event.

Usage: python -m bench.watch_cost [--nodes 1000]

One real API server, N GPU Nodes and one gpu.nvidia.com ResourceSlice per Node (as NVIDIA's DRA
driver publishes them). Then, in turn: no watch; N Node watches (fieldSelector metadata.name, as
each agent's NodeWatch); N ResourceSlice watches on top (fieldSelector spec.nodeName,spec.driver,
as reporters/resource_slices.SliceWatch). After each step: the API server's Go heap in use
(`go_memstats_heap_inuse_bytes`, after a settle) and its RSS, and the CPU it spends on one PATCH of
every Node (each one event for its own Node watch) and one of every slice. Printed per watch and
per event, and what that makes at 12,500 nodes (bench/README.md, "What a watch costs").
"""

from __future__ import annotations

import argparse
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agent.reporters.kube_rest import KubeRest
from bench._kube import apiserver_metrics, core_api, kube_env, machine, proc_cpu_s, proc_rss_kb
from bench.fleet import create_node

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def heap_mib(env: Any) -> float:
    return sum(s.value for s in apiserver_metrics(env, ("go_memstats_heap_inuse_bytes",))) / 2**20


def make_slice(rest: KubeRest, node: str) -> None:
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": f"gpu-{i}"} for i in range(8)],
        },
    }
    rest.json("POST", SLICES, body=body)


class Watches:
    """N open watches from this process, each in a thread, counting the events they receive."""

    def __init__(self, rest: KubeRest, path: str, selectors: list[str]) -> None:
        self.events = 0
        self._lock = threading.Lock()
        self._streams: list[Any] = []
        self.opened = threading.Semaphore(0)
        for sel in selectors:
            threading.Thread(target=self._run, args=(rest, path, sel), daemon=True).start()
        for _ in selectors:
            self.opened.acquire(timeout=120)

    def _run(self, rest: KubeRest, path: str, selector: str) -> None:
        w = rest.watch(path, query={"fieldSelector": selector, "timeoutSeconds": 3600}, timeout=(10, 3700))
        self._streams.append(w)
        first = True
        try:
            for _ev in w:
                with self._lock:
                    self.events += 1
                if first:
                    first = False
                    self.opened.release()
        except Exception:
            pass

    def stop(self) -> None:
        for w in self._streams:
            w.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    args = ap.parse_args()
    n = args.nodes
    print(f"machine: {machine()}")
    with kube_env() as env:
        pid = env.plane.apiserver.pid
        core = core_api(env, pool=n + 64)
        rest = KubeRest.of(core)
        names = [f"gpu-{i:05d}" for i in range(n)]
        with ThreadPoolExecutor(32) as ex:
            list(ex.map(lambda name: create_node(core, name), names))
            list(ex.map(lambda name: make_slice(rest, name), names))

        def step(label: str) -> dict[str, float]:
            time.sleep(10)  # the watch cache and the Go heap settle
            return {"heap": heap_mib(env), "rss": proc_rss_kb(pid) / 1024}

        def churn(tag: str) -> tuple[float, float]:
            """CPU of the API server for one PATCH of every Node, then one of every slice."""
            out = []
            for kind in ("node", "slice"):
                c0 = proc_cpu_s(pid)

                def patch(name: str, kind: str = kind) -> None:
                    path = f"/api/v1/nodes/{name}" if kind == "node" else f"{SLICES}/{name}-gpu"
                    body = {"metadata": {"labels": {"bench.example/churn": tag}}}
                    rest.json("PATCH", path, body=body, content_type="application/merge-patch+json")

                with ThreadPoolExecutor(16) as ex:
                    list(ex.map(patch, names))
                time.sleep(2)
                out.append(proc_cpu_s(pid) - c0)
            return out[0], out[1]

        base = step("none")
        cpu0 = churn("a")
        nodes_w = Watches(rest, "/api/v1/nodes", [f"metadata.name={m}" for m in names])
        with_nodes = step("node watches")
        cpu1 = churn("b")
        slices_w = Watches(rest, SLICES, [f"spec.nodeName={m},spec.driver=gpu.nvidia.com" for m in names])
        with_slices = step("slice watches")
        cpu2 = churn("c")
        events = (nodes_w.events, slices_w.events)
        nodes_w.stop()
        slices_w.stop()

    def per(a: float, b: float) -> float:
        return float(b - a) / n * 1024  # KiB per watch

    print(
        f"{n} Nodes, {n} ResourceSlices; events received by the watches: nodes {events[0]}, "
        f"slices {events[1]}"
    )
    print(f"  no watch:               heap {base['heap']:.0f} MiB, RSS {base['rss']:.0f} MiB")
    print(
        f"  +{n} Node watches:      heap {with_nodes['heap']:.0f} MiB, RSS {with_nodes['rss']:.0f} MiB: "
        f"{per(base['heap'], with_nodes['heap']):.1f} KiB heap, "
        f"{per(base['rss'], with_nodes['rss']):.1f} KiB RSS per watch"
    )
    print(
        f"  +{n} slice watches:     heap {with_slices['heap']:.0f} MiB, RSS {with_slices['rss']:.0f} MiB: "
        f"{per(with_nodes['heap'], with_slices['heap']):.1f} KiB heap, "
        f"{per(with_nodes['rss'], with_slices['rss']):.1f} KiB RSS per watch"
    )
    print(
        f"  CPU for {n} Node PATCHes / {n} slice PATCHes: no watch {cpu0[0]:.2f} / {cpu0[1]:.2f} s; "
        f"with Node watches {cpu1[0]:.2f} / {cpu1[1]:.2f} s; with both {cpu2[0]:.2f} / {cpu2[1]:.2f} s"
    )
    for label, watches in (("Node watch", with_nodes), ("slice watch", with_slices)):
        before = base if label == "Node watch" else with_nodes
        kib = per(before["heap"], watches["heap"])
        print(f"  at 12,500 nodes one {label} per agent: {kib * 12500 / 1024:.0f} MiB of heap")


if __name__ == "__main__":
    main()
