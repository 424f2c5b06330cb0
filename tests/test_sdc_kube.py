"""The SDC probe through the active-check window on the real API server: the real agent
(tests/active_node.py, `gpu-healthcheck agent` as cli/agent.py wires it) with sdc.address set to a
real probe server (sdcprobe/server.py, each run a real subprocess on the CPU stand-in). While the
run computes, the Node carries the testing taint and the node's fleet slot is held; a pod that
arrives aborts it (the server's run aborted, its compute killed), the taint lifts, the slot is
given back, an ActiveCheckAborted Event says so and the check is "not run yet", never unknown; once
the pod left it runs again and the node reads the probe's verdict. The DCGM diag shares the window:
one at a time, and the SDC probe's taint writes start no diag of their own."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

import tests.test_active_checks_kube as active
from agent.core.node_keys import EventReason
from agent.reporters.active_checks import slot_name
from sdcprobe.server import Server, handler
from tests.kubeenv.waiting import wait_for
from tests.test_active_checks_kube import Arrival, K, Worker, check, events, slots, taint_keys

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.kube


@pytest.fixture
def core(kube: Any) -> Iterator[k8s.CoreV1Api]:
    with kube.api_client() as api:
        yield k8s.CoreV1Api(api)


@pytest.fixture
def libs(fake_libdcgm_dir: Path, fake_libnvml_dir: Path) -> tuple[Path, Path]:
    return fake_libdcgm_dir, fake_libnvml_dir


@pytest.fixture
def probe(tmp_path: Path) -> Iterator[tuple[Server, str]]:
    """The node's probe server: 4 stand-in GPUs, FP64 and FP32, each kernel 2 s (a run of 8 s)."""
    os.environ["PYTHONPATH"] = str(ROOT)
    args = ["--backend", "cpu", "--cpu-devices", "4", "--precisions", "fp64,fp32", "--size", "8"]
    server = Server([*args, "--cpu-delay", "2"], 120.0, tmp_path)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler(server))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield server, f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        if server.last is not None:
            server.last.abort()


def state(server: Server) -> str | None:
    return server.last.doc()["state"] if server.last is not None else None


@pytest.mark.timeout(420)
def test_an_sdc_run_holds_the_window_and_a_pod_arriving_aborts_it(
    kube: Any,
    core: k8s.CoreV1Api,
    gpu_node: Any,
    kube_namespace: str,
    tmp_path: Path,
    libs: tuple[Path, Path],
    probe: tuple[Server, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, address = probe
    base = yaml.safe_load(active.config_yaml(1))
    doc = {**base, "sdc": {"address": address}}
    monkeypatch.setattr(active, "config_yaml", lambda max_concurrent: yaml.safe_dump(doc))
    node = gpu_node().metadata.name
    kube.create_service_account(kube_namespace, "default")
    worker = Worker(node, tmp_path / "w", kube.kubeconfig, kube_namespace, libs, diag_seconds=5.0)
    try:
        # 1. The run computes with the node held and the fleet slot taken.
        wait_for(lambda: worker.alive() and state(server) == "running", 180, "the SDC run computing")
        first_run = server.last
        diags = worker.diags()  # the diag due at the start ran first, or waits: never both at once
        assert all(end is not None for _, end in diags), diags
        assert K.testing in taint_keys(core, node)
        assert slots(kube, kube_namespace) == [slot_name(K.prefix, node)]
        # 2. A pod arrives: the run is aborted at once, the taint lifts, the slot is given back.
        arrival = Arrival(kube, kube_namespace, node, worker, "train-0")
        wait_for(
            lambda: first_run is not None and first_run.doc()["state"] == "aborted", 30, "the run aborted"
        )
        assert first_run is not None and first_run.proc.wait(timeout=10) == -9  # its compute killed
        wait_for(lambda: K.testing not in taint_keys(core, node), 60, "the taint lifted")
        wait_for(lambda: slots(kube, kube_namespace) == [], 30, "the slot given back")
        (said,) = wait_for(lambda: events(core, node, EventReason.ACTIVE_CHECK_ABORTED), 30, "the Event")
        assert "SDC probe aborted" in said and "train-0" in said
        res = check(core, node, "sdc")
        assert res.get("status") in (None, "skipped"), res  # not run yet: never unknown
        # 3. The pod leaves: the run again, completed, read by the agent.
        arrival.leave()
        wait_for(lambda: server.last is not first_run and state(server) == "completed", 120, "the run again")
        res = wait_for(lambda: (c := check(core, node, "sdc")).get("status") == "pass" and c, 60, "read")
        assert "4 GPUs agreed bit for bit on 4 kernels and precisions" in res["message"], res
        assert K.testing not in taint_keys(core, node)
        time.sleep(8)  # past retrySeconds (2): the SDC probe's holds made no diag due
        assert len(worker.diags()) == max(1, len(diags)), worker.diags()
    finally:
        worker.stop()
