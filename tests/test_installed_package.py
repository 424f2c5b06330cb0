"""The package as the image has it: built into a wheel and imported from outside the source tree.

Dockerfile.agent pip-installs the project, so nothing next to the source checkout (config/) exists
there. These tests catch what a source-tree run cannot: a default read from a repository path.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
XID79 = ROOT / "examples" / "snapshots" / "p5.48xlarge-xid79"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel unpacked into a directory of its own: the installed layout, without a venv."""
    out = tmp_path_factory.mktemp("wheel")
    # Built from a copy, as `COPY . /src` gives the image: setuptools builds in the tree it is given,
    # and a build/ left there from an older layout would leak stale modules into the wheel.
    src = out / "src"
    skip = shutil.ignore_patterns(
        ".git", ".venv", ".cache", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis"
    )
    shutil.copytree(ROOT, src, symlinks=True, ignore=skip)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob("gpu_healthcheck-*.whl")
    site = out / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    return site


def run_installed(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GPU_HEALTHCHECK_CONFIG_DIR"}
    env["PYTHONPATH"] = str(site)
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


PROBE = """
import json, sys
from pathlib import Path
import agent
from agent.config import load_config_dir
assert Path(agent.__file__).resolve().is_relative_to(Path(sys.argv[1]).resolve()), agent.__file__
cfgs = {"shipped": load_config_dir(), "only-config-yaml": load_config_dir(Path(sys.argv[2]))}
print(json.dumps({
    name: {
        "profiles": len(cfg.profiles),
        "xid79": cfg.xid_severity(79).label,
        "incidents": len(cfg.dcgm_incidents.rules),
    }
    for name, cfg in cfgs.items()
}))
"""


def test_the_installed_package_reads_every_shipped_table(installed: Path, tmp_path: Path) -> None:
    only = tmp_path / "configmap"
    only.mkdir()
    (only / "config.yaml").write_text("jitterFraction: 0.05\n")
    res = run_installed(installed, tmp_path, "-c", PROBE, str(installed), str(only))
    assert res.returncode == 0, res.stderr
    for name, seen in json.loads(res.stdout).items():
        assert seen["profiles"] > 10, name
        assert seen["xid79"] == "reboot", name
        assert seen["incidents"] > 10, name


def test_the_installed_cli_judges_an_xid_79_as_reboot_with_a_configmap_of_config_yaml_only(
    installed: Path, tmp_path: Path
) -> None:
    only = tmp_path / "configmap"
    only.mkdir()
    (only / "config.yaml").write_text("jitterFraction: 0.05\n")
    res = run_installed(
        installed,
        tmp_path,
        "-m",
        "agent.cli",
        "check",
        "--from-snapshot",
        str(XID79),
        "--config-dir",
        str(only),
        "--only",
        "xid",
        "--json",
    )
    assert res.returncode == 1, res.stderr
    doc = json.loads(res.stdout)
    assert doc["severity"] == "reboot"
    (xid,) = [c for c in doc["checks"] if c["name"] == "xid"]
    assert xid["status"] == "fail" and "79" in xid["message"]
