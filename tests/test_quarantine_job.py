"""The quarantine Job as documented: the command in manifests/jobs/quarantine-job.yaml's header makes a
valid Job on the real API server; the Job's own container command then runs here, as the Job's
ServiceAccount with a node-bound token (as the kubelet gives it), against a fake `dcgmi` on PATH that
prints a recorded output (with the warning line dcgmi puts before the JSON); the result lands in the
Node annotation."""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.cli import quarantine
from agent.probes.dcgm.dcgmi import run_dcgmi_diag
from tests.conftest import cfg

ROOT = Path(__file__).parent.parent
JOB = ROOT / "manifests" / "jobs" / "quarantine-job.yaml"
FIX = Path(__file__).parent / "fixtures" / "dcgm"
PASS_31 = FIX / "dcgm-repo-8gpu-dcgmi-diag-j-3.1.0-real-output-with-warning-prefix.json"
FAIL_4X = FIX / "dcgmi_diag_r4_json_v4-DERIVED-gpu3-fail-isolate.json"
NS, SA = "gpu-healthcheck", "gpu-healthcheck-quarantine"
KEY = "gpu-healthcheck/quarantine-result"
CFG = cfg()
NOW = datetime.datetime(2026, 11, 22, 12, 0, tzinfo=datetime.timezone.utc)


def documented_command() -> str:
    line = next(ln for ln in JOB.read_text().splitlines() if "| kubectl create -f -" in ln)
    return line.lstrip("# ").strip()


def fake_dcgmi(tmp: Path, output: Path | str, rc: int = 0) -> Path:
    """A `dcgmi` that records its arguments and prints a recorded output; plus python3 = this venv's."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    text = output.read_text() if isinstance(output, Path) else output
    (tmp / "out.txt").write_text(text)
    script = bin_dir / "dcgmi"
    script.write_text(f'#!/bin/sh\necho "$@" > {tmp}/args\ncat {tmp}/out.txt\nexit {rc}\n')
    script.chmod(0o755)
    py = bin_dir / "python3"  # a wrapper, not a link: a venv is found from the path it is started by
    py.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    py.chmod(0o755)
    return bin_dir


# ------------------------------------------------------------------------------- judging, no cluster


def test_warning_prefixed_real_output_is_a_pass() -> None:
    doc = quarantine.judge(3, 0, PASS_31.read_text(), CFG, NOW)
    assert doc["result"] == "pass" and doc["level"] == 3 and doc["at"] == "2026-11-22T12:00:00+00:00"
    assert "passed" in doc["summary"] and doc["findings"] == []


def test_failing_gpu_is_a_fail_with_its_finding() -> None:
    doc = quarantine.judge(3, 0, "WARNING: dcgmi is old\n" + FAIL_4X.read_text(), CFG, NOW)
    assert doc["result"] == "fail" and "GPU 3" in doc["summary"]
    assert [f["key"] for f in doc["findings"]] == ["dcgm-diag/diagnostic/3"]
    assert doc["findings"][0]["severity"] == "isolate"


def test_unreadable_or_failed_runs_are_errors_never_passes() -> None:
    err = quarantine.judge(3, 255, "Error: unable to establish a connection to the specified host", CFG, NOW)
    assert err["result"] == "error" and "unable to establish" in err["summary"]
    runtime = '{"DCGM Diagnostic": {"version": "4.6.0", "runtime_error": "GPUs are in use"}}'
    assert quarantine.judge(3, 226, runtime, CFG, NOW)["result"] == "error"
    assert quarantine.judge(3, 1, PASS_31.read_text(), CFG, NOW)["result"] == "error"  # rc says no
    assert quarantine.judge(3, -1, "dcgmi did not finish", CFG, NOW)["result"] == "error"


def test_run_dcgmi_passes_host_level_and_json(tmp_path: Path) -> None:
    bin_dir = fake_dcgmi(tmp_path, PASS_31)
    rc, out = run_dcgmi_diag(str(bin_dir / "dcgmi"), "h:5555", 4, 30)
    assert rc == 0 and "DCGM GPU Diagnostic" in out
    assert (tmp_path / "args").read_text().split() == ["diag", "--host", "h:5555", "-r", "4", "-j"]
    assert run_dcgmi_diag(str(tmp_path / "missing"), "h", 3, 30)[0] == -1


# ------------------------------------------------------------------------------- on the API server


def run_job_container(job: dict[str, Any], node: str, kubeconfig: Path, bin_dir: Path) -> Any:
    """The Job's container command, with the env the kubelet would give it."""
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    for e in container["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
        elif e["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName":
            env[e["name"]] = node
    env |= {"PATH": f"{bin_dir}:{env['PATH']}", "KUBECONFIG": str(kubeconfig), "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        container["command"] + container.get("args", []),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.kube
def test_documented_command_makes_a_job_that_annotates_its_node(
    kube: Any, gpu_node: Any, tmp_path: Path
) -> None:
    kube.kubectl("apply", "--server-side", "-f", str(ROOT / "manifests"))
    kube.kubectl("apply", "--server-side", "-f", str(JOB.parent / "quarantine-rbac.yaml"))
    node = gpu_node().metadata.name
    cmd = documented_command().replace("<node>", node)
    sed = cmd.split("|")[0].strip()
    assert re.fullmatch(r"sed -e '[^']+' -e '[^']+' manifests/jobs/quarantine-job.yaml", sed), cmd
    rendered = subprocess.run(["sh", "-c", sed], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "__" not in rendered.split("apiVersion", 1)[1]  # no placeholder left
    out = kube.kubectl("create", "-f", "-", "-o", "json", input=rendered).stdout
    job = json.loads(out)
    spec = job["spec"]["template"]["spec"]
    assert job["metadata"]["name"].startswith("gpu-quarantine-")
    assert spec["nodeSelector"] == {"kubernetes.io/hostname": node}
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env["DIAG_LEVEL"] == "3" and "NODE_NAME" in env

    token = kube.token_for(NS, SA, bound_node=node, expiration=600, create=False)
    kcfg = kube.kubeconfig_for_token(token)
    bin_dir = fake_dcgmi(tmp_path, PASS_31)
    proc = run_job_container(job, node, kcfg, bin_dir)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "args").read_text().split() == [
        "diag", "--host", "nvidia-dcgm.gpu-healthcheck.svc:5555", "-r", "3", "-j",
    ]  # fmt: skip
    _, body = kube.request("GET", f"/api/v1/nodes/{node}")
    result = json.loads(body["metadata"]["annotations"][KEY])
    assert result["result"] == "pass" and result["level"] == 3 and result["exitCode"] == 0

    fake_dcgmi(tmp_path, "WARNING: nvvs log rotated\n" + FAIL_4X.read_text(), rc=226)
    proc = run_job_container(job, node, kcfg, bin_dir)
    assert proc.returncode == 1, proc.stderr  # the Job fails: kubectl get jobs shows it
    _, body = kube.request("GET", f"/api/v1/nodes/{node}")
    result = json.loads(body["metadata"]["annotations"][KEY])
    assert result["result"] == "fail" and result["findings"][0]["key"] == "dcgm-diag/diagnostic/3"
