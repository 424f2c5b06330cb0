"""Active checks on the real API server (docs/guides/active-checks.md): the real agent (tests/active_node.py:
`gpu-healthcheck agent` on a snapshot, with the live DCGM tiers on its own fake engine) on each of
several GPU Nodes, the fleet slots counted through Leases in the test's namespace.

- 10 idle nodes with node.activeChecks.maxConcurrent 2: never more than 2 diags at once (as each
  node's fake engine saw them run) nor 2 testing taints at once (as a watch of the Nodes saw them);
  each diag ran while its node carried the taint; every node ends with a passing diag, its taint
  lifted and its slot given back;
- a pod that arrives mid-diag (it tolerates the taint, and the kubelet shows it holding the GPUs):
  the diag is aborted, the taint lifts, an ActiveCheckAborted Event says who came; the diag did not
  run, so the Node keeps the last completed verdict (none yet: the check is skipped, never unknown),
  and once the pod left a diag runs again within retrySeconds and a margin and completes; an
  operator's request aborted so is retried the same way, lastDiag saying when and which try;
- `gpu-healthcheck diag NODE` as the admin: before the node's agent runs, `status` lists it pending;
  then the diag starts, the annotation goes, an ActiveCheckStarted Event and the results annotation's
  lastDiag (completed) and the history annotation's `diag` entry name who asked and why, and
  `status` lists it completed; asked again with
  --wait, it starts at the next idle window;
- in-process: slots taken at the same instant by 10 nodes with a bound of 2: exactly 2 granted; and
  the admission policy lets a fenced agent hold only its own node's slot.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch

from agent.core.history_annotation import parse
from agent.core.node_keys import EventReason, Keys
from agent.reporters.active_checks import FleetSlots, slot_name
from agent.reporters.brake import Brake
from agent.reporters.kube_rest import KubeRest
from tests.conftest import brake_cfg, node_cfg
from tests.kubeenv.env import unique_name
from tests.kubeenv.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent
HEALTHY = ROOT / "examples" / "snapshots" / "p5.48xlarge-healthy"
FAKE_DCGM = ROOT / "tests" / "fakes" / "dcgm"
K = Keys()
pytestmark = pytest.mark.kube


@pytest.fixture
def core(kube: Any) -> Iterator[k8s.CoreV1Api]:
    with kube.api_client() as api:
        yield k8s.CoreV1Api(api)


def config_yaml(max_concurrent: int) -> str:
    return yaml.safe_dump(
        {
            "intervals": {"gpu": 10, "dcgmHealth": 60, "dcgmDiag": 3600, "efa": 600, "topology": 600},
            "node": {
                "maxTaintedFraction": 1,
                "activeChecks": {"maxConcurrent": max_concurrent, "retrySeconds": 2},
            },
        }
    )


class Worker:
    """tests/active_node.py for one Node, as a child process (stopped by its PID)."""

    def __init__(
        self,
        node: str,
        work: Path,
        kubeconfig: Path,
        namespace: str,
        libs: tuple[Path, Path],
        *,
        diag_seconds: float,
        max_concurrent: int = 2,
        dcgm_gpus: int = 8,
    ) -> None:
        self.node = node
        work.mkdir(parents=True)
        cfg = work / "config"
        cfg.mkdir()
        (cfg / "config.yaml").write_text(config_yaml(max_concurrent))
        snap = work / "snap"
        import shutil

        shutil.copytree(HEALTHY, snap, symlinks=True)
        self.log = work / "agent.log"
        env = dict(
            os.environ,
            PYTHONUNBUFFERED="1",
            POD_NAMESPACE=namespace,
            GPU_HEALTHCHECK_DCGM_PYTHON=str(FAKE_DCGM),
            LD_LIBRARY_PATH=f"{libs[0]}:{libs[1]}:{os.environ.get('LD_LIBRARY_PATH', '')}",
            FAKE_NVML_CONFIG=str(work / "fake-nvml.conf"),
        )
        argv = [
            sys.executable, "-m", "tests.active_node", "--node", node, "--snapshot", str(snap),
            "--kubeconfig", str(kubeconfig), "--config-dir", str(cfg), "--work", str(work),
            "--diag-seconds", str(diag_seconds), "--dcgm-gpus", str(dcgm_gpus),
        ]  # fmt: skip
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)

    def alive(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text(errors="replace")[-3000:]
        return True

    def diags(self) -> list[tuple[float, float | None]]:
        """(start, end or None) of each diag the fake engine ran."""
        out: list[tuple[float, float | None]] = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("DIAG start "):
                out.append((float(line.split()[2]), None))
            elif line.startswith("DIAG end ") and out and out[-1][1] is None:
                out[-1] = (out[-1][0], float(line.split()[2]))
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class TaintWatch:
    """A watch of the Nodes of one pool: when each carried the testing taint, and the most at once."""

    def __init__(self, kube: Any, pool: str) -> None:
        self.api = kube.api_client()
        self.pool = pool
        self.on: dict[str, float] = {}
        self.spans: dict[str, list[tuple[float, float]]] = {}
        self.most = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        core = k8s.CoreV1Api(self.api)
        w = k8s_watch.Watch()
        for ev in w.stream(
            core.list_node, label_selector=f"test.example/pool={self.pool}", timeout_seconds=600
        ):
            node = ev["object"]
            name = node.metadata.name
            tainted = any(t.key == K.testing for t in node.spec.taints or ())
            now = time.time()
            if tainted and name not in self.on:
                self.on[name] = now
            elif not tainted and name in self.on:
                self.spans.setdefault(name, []).append((self.on.pop(name), now))
            self.most = max(self.most, len(self.on))
            if self.stop.is_set():
                w.stop()

    def close(self) -> None:
        self.stop.set()
        self.api.close()


def results(core: k8s.CoreV1Api, node: str) -> dict[str, Any]:
    ann = core.read_node(node).metadata.annotations or {}
    return json.loads(ann.get(K.results, "{}"))


def check(core: k8s.CoreV1Api, node: str, name: str) -> dict[str, Any]:
    return next((c for c in results(core, node).get("checks", ()) if c["name"] == name), {})


def taint_keys(core: k8s.CoreV1Api, node: str) -> set[str]:
    return {t.key for t in core.read_node(node).spec.taints or ()}


def slots(kube: Any, namespace: str) -> list[str]:
    code, body = kube.request(
        "GET",
        f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases",
        query={"labelSelector": f"{K.prefix}/record=slot"},
    )
    assert code == 200, body
    return [i["metadata"]["name"] for i in body["items"]]


def events(core: k8s.CoreV1Api, node: str, reason: str) -> list[str]:
    items = core.list_namespaced_event("default", field_selector=f"involvedObject.name={node}").items
    return [e.message for e in items if e.reason == reason]


def most_at_once(spans: list[tuple[float, float]]) -> int:
    points = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    now = most = 0
    for _, step in points:
        now += step
        most = max(most, now)
    return most


@pytest.fixture
def libs(fake_libdcgm_dir: Path, fake_libnvml_dir: Path) -> tuple[Path, Path]:
    return fake_libdcgm_dir, fake_libnvml_dir


@pytest.mark.timeout(600)
def test_ten_idle_nodes_with_a_bound_of_two_never_run_more_than_two(
    kube: Any,
    core: k8s.CoreV1Api,
    gpu_node: Any,
    kube_namespace: str,
    tmp_path: Path,
    libs: tuple[Path, Path],
) -> None:
    pool = unique_name("pool")
    nodes = [gpu_node(labels={"test.example/pool": pool}).metadata.name for _ in range(10)]
    watch = TaintWatch(kube, pool)
    workers = [
        Worker(n, tmp_path / n, kube.kubeconfig, kube_namespace, libs, diag_seconds=6.0) for n in nodes
    ]
    try:
        for n in nodes:
            wait_for(
                lambda n=n: (
                    all(w.alive() for w in workers) and check(core, n, "dcgm-diag").get("status") == "pass"
                ),
                420,
                f"{n}'s diag",
            )
        wait_for(lambda: not any(K.testing in taint_keys(core, n) for n in nodes), 60, "every taint lifted")
    finally:
        for w in workers:
            w.stop()
        watch.close()
    runs = {w.node: w.diags() for w in workers}
    every = [(s, e) for spans in runs.values() for s, e in spans if e is not None]
    assert all(len(r) == 1 and r[0][1] is not None for r in runs.values()), runs
    assert most_at_once(every) == 2  # the bound held, and it was reached (the nodes contended)
    assert watch.most <= 2 and sum(len(s) for s in watch.spans.values()) == 10
    for node, ((start, end),) in runs.items():  # each diag ran while its node was held
        (on, off), *_ = watch.spans[node]
        assert on <= start and end <= off + 1.0, (node, on, start, end, off)
    assert slots(kube, kube_namespace) == []  # every slot given back
    held = sum("waiting for a fleet slot" in w.log.read_text() for w in workers)
    assert held >= 1  # some node waited its turn


def node_marks(core: k8s.CoreV1Api, node: str) -> tuple[str | None, str | None]:
    """The Node's status label and GPUHealthy condition status."""
    n = core.read_node(node)
    cond = next((c.status for c in n.status.conditions or () if c.type == "GPUHealthy"), None)
    return (n.metadata.labels or {}).get(K.status), cond


class Arrival:
    """A pod that comes for the node's GPUs (bound there, it tolerates the testing taint) and holds
    them as the node's kubelet shows it (tests/active_node.py's file), until it leaves."""

    def __init__(self, kube: Any, namespace: str, node: str, worker: Worker, name: str) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self.listing = worker.log.parent / "kubelet-pods"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "nodeName": node,  # as a scheduler binds it: it tolerates the taint
                "tolerations": [{"key": K.testing, "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [
                    {"name": "main", "image": "registry.k8s.io/pause:3.10",
                     "resources": {"limits": {"nvidia.com/gpu": "8"}}}
                ],
            },
        }  # fmt: skip
        self.at = time.monotonic()
        code, body = kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
        assert code == 201, body
        self.listing.write_text(f"{namespace}/{name}\n")

    def leave(self) -> float:
        """The pod is gone (the kubelet no longer shows it); when (monotonic)."""
        self.listing.write_text("")
        path = f"/api/v1/namespaces/{self.namespace}/pods/{self.name}"
        code, body = self.kube.request("DELETE", path, {"gracePeriodSeconds": 0})
        assert code == 200, body
        return time.monotonic()


@pytest.mark.timeout(420)
def test_a_diag_aborted_by_an_arriving_pod_keeps_the_verdict_and_runs_again_once_idle(
    kube: Any,
    core: k8s.CoreV1Api,
    gpu_node: Any,
    kube_namespace: str,
    tmp_path: Path,
    libs: tuple[Path, Path],
) -> None:
    """Not run, not "could not look": an aborted diag leaves the Node's verdict as the last completed
    diag made it (none yet: the check is skipped, not unknown), and runs again within retrySeconds
    (2) of the GPUs being idle, the taint lifting meanwhile; an operator's request is retried the
    same way and lastDiag says so."""
    node = gpu_node().metadata.name
    kube.create_service_account(kube_namespace, "default")  # pods are admitted with it (no controller)
    worker = Worker(node, tmp_path / "w", kube.kubeconfig, kube_namespace, libs, diag_seconds=15.0)
    margin = 20.0  # the slot, the taint written and seen on the Node, on a loaded machine
    try:
        # 1. The first diag, aborted: no diag completed yet, the check is "not run yet".
        wait_for(lambda: worker.alive() and worker.diags(), 180, "the diag running")
        assert K.testing in taint_keys(core, node)
        assert slots(kube, kube_namespace) == [slot_name(K.prefix, node)]
        first = Arrival(kube, kube_namespace, node, worker, "train-0")
        wait_for(lambda: K.testing not in taint_keys(core, node), 60, "the taint lifted")
        lifted = time.monotonic() - first.at
        wait_for(lambda: worker.diags()[-1][1] is not None, 30, "the engine's diag stopped")
        res = wait_for(
            lambda: (c := check(core, node, "dcgm-diag")).get("status") == "skipped" and c, 60, "not run yet"
        )
        assert res["message"].startswith("DCGM diag not run yet: a level 2 diag aborted: ")
        assert (
            "train-0" in res["message"] and "runs again once the GPUs are idle, not before" in res["message"]
        )
        status, healthy = node_marks(core, node)
        assert status not in ("unknown", "fail") and healthy == "True", (status, healthy)
        (said,) = wait_for(lambda: events(core, node, EventReason.ACTIVE_CHECK_ABORTED), 30, "the Event")
        assert "train-0" in said and "not run" in said
        wait_for(lambda: slots(kube, kube_namespace) == [], 30, "the slot given back")
        print(f"taint lifted {lifted:.1f} s after the pod arrived")
        assert lifted < 30
        time.sleep(8)  # past its retry (2 s): the pod holds the GPUs, no diag starts
        assert len(worker.diags()) == 1 and K.testing not in taint_keys(core, node)
        # 2. The pod leaves: a diag runs within retrySeconds and a margin, and completes.
        gone = first.leave()
        wait_for(lambda: len(worker.diags()) == 2, 2 + margin, "the diag again, within retrySeconds")
        print(f"the diag ran again {time.monotonic() - gone:.1f} s after the pod left")
        wait_for(lambda: check(core, node, "dcgm-diag").get("status") == "pass", 90, "the diag passed")
        passed = node_marks(core, node)
        assert passed == ("pass", "True"), passed
        # 3. An operator's diag, aborted by a pod: the pass stays, lastDiag says when it runs again.
        asked = cli(kube.kubeconfig, "diag", node, "--reason", "INC-9", "--level", "3")
        assert asked.returncode == 0, asked.stdout + asked.stderr
        wait_for(lambda: len(worker.diags()) == 3, 60 + margin, "the requested diag running")
        second = Arrival(kube, kube_namespace, node, worker, "train-1")
        aborted = wait_for(
            lambda: (d := results(core, node).get("lastDiag") or {}).get("outcome") == "aborted" and d,
            60,
            "the request recorded aborted",
        )
        assert "train-1" in aborted["abortReason"] and aborted["retryAt"] and "attempt" not in aborted
        res = check(core, node, "dcgm-diag")
        assert res["status"] == "pass" and "since then a level 3 diag aborted" in res["message"], res
        assert node_marks(core, node) == passed
        # 4. It leaves: the request runs again, its second try, and completes.
        gone = second.leave()
        wait_for(lambda: len(worker.diags()) == 4, 2 + margin, "the request again, within retrySeconds")
        print(f"the request ran again {time.monotonic() - gone:.1f} s after the pod left")
        done = wait_for(
            lambda: (d := results(core, node).get("lastDiag") or {}).get("outcome") == "completed" and d,
            90,
            "the request's retry recorded completed",
        )
        assert done["attempt"] == 2 and done["level"] == 3 and done["reason"] == "INC-9"
        assert all(end is not None for _, end in worker.diags())
        wait_for(lambda: "since then" not in check(core, node, "dcgm-diag").get("message", "x"), 60, "read")
        assert node_marks(core, node) == passed
    finally:
        worker.stop()


def cli(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`gpu-healthcheck ARGS` as the admin (the test's kubeconfig: gpuhc-test-admin, system:masters)."""
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", *args, "--kubeconfig", str(kubeconfig)],
        cwd=ROOT, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip


def status_of(kubeconfig: Path, node: str) -> tuple[dict[str, Any], str]:
    """`status NODE` as JSON (that node's entry) and as the table."""
    as_json = cli(kubeconfig, "status", node, "-o", "json")
    assert as_json.returncode in (0, 2), as_json.stdout + as_json.stderr  # 2: no Ready agent there
    (mine,) = json.loads(as_json.stdout)
    return mine, cli(kubeconfig, "status", node).stdout


@pytest.mark.timeout(420)
def test_diag_on_demand_is_pending_then_starts_at_the_next_idle_window_audited(
    kube: Any,
    core: k8s.CoreV1Api,
    gpu_node: Any,
    kube_namespace: str,
    tmp_path: Path,
    libs: tuple[Path, Path],
) -> None:
    node = gpu_node().metadata.name
    admin = "gpuhc-test-admin"  # the admin's certificate CN, as SelfSubjectReview names it
    # Asked before the node's agent runs: the request waits on the Node, and `status` lists it.
    asked = cli(kube.kubeconfig, "diag", node, "--reason", "INC-7: after a reseat", "--level", "3")
    assert asked.returncode == 0, asked.stdout + asked.stderr
    assert f"as {admin}: INC-7: after a reseat" in asked.stdout
    mine, table = status_of(kube.kubeconfig, node)
    assert mine["diagPending"]["by"] == admin and mine["diagPending"]["reason"] == "INC-7: after a reseat"
    assert mine["diagPending"]["level"] == 3 and mine["lastDiag"] is None
    assert f"{node}  asked " in table and f"by {admin}: INC-7: after a reseat [level 3]: pending" in table
    worker = Worker(node, tmp_path / "w", kube.kubeconfig, kube_namespace, libs, diag_seconds=1.0)
    try:
        done = wait_for(
            lambda: (
                worker.alive()
                and (d := results(core, node).get("lastDiag") or {}).get("outcome") == "completed"
                and d
            ),
            240,
            "the requested diag recorded completed in the results annotation",
        )
        assert done["by"] == admin and done["reason"] == "INC-7: after a reseat" and done["level"] == 3
        assert done["requestedAt"] <= done["startedAt"] <= done["endedAt"]
        assert K.diag_requested not in (core.read_node(node).metadata.annotations or {})
        (said,) = wait_for(lambda: events(core, node, EventReason.ACTIVE_CHECK_STARTED), 30, "the Event")
        assert "level 3" in said and f"{admin} (reason: INC-7: after a reseat)" in said
        history = parse(core.read_node(node).metadata.annotations.get(K.history))
        assert [(e.did, e.by) for e in history if e.diagnosed] == [("diag", admin)]
        mine, table = status_of(kube.kubeconfig, node)
        assert mine["diagPending"] is None and mine["lastDiag"] == done
        assert f"by {admin}: INC-7: after a reseat [level 3]: completed " in table
        wait_for(lambda: check(core, node, "dcgm-diag").get("status") == "pass", 60, "the diag judged")
        # Asked again while the agent runs: it starts at the next idle window.
        before = len(worker.diags())
        run = cli(kube.kubeconfig, "diag", node, "--reason", "INC-8", "--wait", "120")
        assert run.returncode == 0, run.stdout + run.stderr
        assert "the diag started" in run.stdout
        assert K.diag_requested not in (core.read_node(node).metadata.annotations or {})
        wait_for(lambda: len(worker.diags()) > before, 30, "the second diag on the engine")
        again = wait_for(
            lambda: (
                (d := results(core, node).get("lastDiag") or {}).get("reason") == "INC-8"
                and d.get("outcome") == "completed"
                and d
            ),
            60,
            "the second request recorded",
        )
        assert again["by"] == admin
    finally:
        worker.stop()


class ShortLived(FleetSlots):
    """Slots that count 10 s (dcgm.diagTimeout's minimum and the slack are minutes): expiry, quickly."""

    def expire_s(self) -> float:
        return 10.0


def test_slots_taken_at_one_instant_grant_exactly_the_bound(
    kube: Any, core: k8s.CoreV1Api, gpu_node: Any, kube_namespace: str
) -> None:
    pool = unique_name("pool")
    scope = f"nvidia.com/gpu.present=true,test.example/pool={pool}"
    nodes = [gpu_node(labels={"test.example/pool": pool}).metadata.name for _ in range(10)]
    clients = [kube.api_client() for _ in nodes]
    fleet = [
        FleetSlots(
            KubeRest.of(c),
            n,
            namespace=kube_namespace,
            brake=Brake(KubeRest.of(c), scope=scope, node_name=n, cfg=brake_cfg()),
            cfg=node_cfg(activeChecks={"maxConcurrent": 2}),
        )
        for c, n in zip(clients, nodes, strict=True)
    ]
    for s in fleet:
        s.brake.gpu_node_total()
    barrier = threading.Barrier(len(fleet))

    def take(s: FleetSlots) -> str | None:
        barrier.wait()
        return s.acquire()

    try:
        with ThreadPoolExecutor(len(fleet)) as pool_:
            got = list(pool_.map(take, fleet))
        assert sum(g is None for g in got) == 2, got
        assert len(slots(kube, kube_namespace)) == 2
        granted = [s for s, g in zip(fleet, got, strict=True) if g is None]
        waiting = next(s for s, g in zip(fleet, got, strict=True) if g is not None)
        assert waiting.acquire() is not None  # still 2 held
        granted[0].release()
        assert waiting.acquire() is None  # a slot freed: the next one takes it
        # a slot of an agent that died long ago no longer counts
        for s in [granted[1], waiting]:
            s.release()
        one = node_cfg(activeChecks={"maxConcurrent": 1})
        dead = ShortLived(core, nodes[0], namespace=kube_namespace, brake=fleet[0].brake, cfg=one)
        assert dead.acquire() is None
        late = ShortLived(core, nodes[1], namespace=kube_namespace, brake=fleet[1].brake, cfg=one)
        assert late.acquire() is not None
        time.sleep(11.5)  # past the expiry (creationTimestamp has whole seconds)
        assert late.acquire() is None
    finally:
        for c in clients:
            c.close()


def test_the_fence_lets_an_agent_hold_only_its_own_nodes_slot(
    kube: Any, core: k8s.CoreV1Api, gpu_node: Any
) -> None:
    out = kube.kubectl("apply", "--server-side", "-f", str(ROOT / "manifests")).stdout
    assert "gpu-healthcheck-own-slots" in out
    ns, sa = "gpu-healthcheck", "gpu-healthcheck-agent"
    mine, other = gpu_node().metadata.name, gpu_node().metadata.name
    token = kube.token_for(ns, sa, bound_node=mine, expiration=600, create=False)
    leases = f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"

    def slot(node: str, holder: str | None = None, **ann: str) -> dict[str, Any]:
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": slot_name(K.prefix, node),
                "labels": {f"{K.prefix}/record": "slot"},
                "annotations": {f"{K.prefix}/node": node, **ann},
            },
            "spec": {"holderIdentity": holder or node},
        }

    def wait_enforced() -> None:
        deadline = time.monotonic() + 30
        while True:
            code, _ = kube.request("POST", leases, slot(other), token=token)
            if code == 403:
                return
            assert code == 201, code
            kube.request("DELETE", f"{leases}/{slot_name(K.prefix, other)}")
            assert time.monotonic() < deadline, "the slot policy never took effect"
            time.sleep(0.5)

    wait_enforced()
    code, body = kube.request("POST", leases, slot(other), token=token)
    assert code == 403 and "only its own node's active-check slot" in json.dumps(body), body
    code, body = kube.request("POST", leases, slot(mine, holder=other), token=token)
    assert code == 403, body
    code, body = kube.request("POST", leases, slot(mine, **{f"{K.prefix}/by": "alice"}), token=token)
    assert code == 403, body  # no forged `by`
    code, body = kube.request("POST", leases, slot(mine), token=token)
    assert code == 201, body
    assert kube.request("POST", leases, slot(other))[0] == 201  # an admin writes any
    code, body = kube.request("DELETE", f"{leases}/{slot_name(K.prefix, other)}", token=token)
    assert code == 403, body  # not another node's
    assert kube.request("DELETE", f"{leases}/{slot_name(K.prefix, mine)}", token=token)[0] == 200
    # a Lease that is no slot record is not this policy's business (the repair budget's mark of its
    # own node: gpu-healthcheck-own-records lets it through, tests/test_records_fence_kube.py)
    other_record = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "generateName": "x-",
            "labels": {f"{K.prefix}/record": "mark"},
            "annotations": {f"{K.prefix}/node": mine},
        },
        "spec": {"holderIdentity": mine},
    }
    code, made = kube.request("POST", leases, other_record, token=token)
    assert code == 201, made
    kube.request("DELETE", f"{leases}/{slot_name(K.prefix, other)}")
    kube.request("DELETE", f"{leases}/{made['metadata']['name']}")
