"""The Go tools the tests run, built all at once beside the Python tests that need none.

kube-bins (etcd, kube-apiserver, kubectl, kube-controller-manager), helm, karpenter-kwok and
promtool are built from the Go module proxy by scripts/build-<tool>.sh, once per machine. A cold
build of all four takes minutes, so the session (tests/kubeenv/fixtures.py):

1. after collection, starts ``scripts/build-go-tools.sh --background`` for the tools the selected
   tests need (it returns at once, and builds nothing that is built);
2. runs the test modules that need no Go tool yet to build first, then those that wait for
   kube-bins only, then the rest, each group longest first (file_times.py); with every tool built,
   one group;
3. before the first test that needs a tool, outside that test's timeout, runs the tool's script,
   which waits for the build under way (the script's lock), or builds it, or fails: the failure,
   with the build's own last lines, fails every test that needs the tool (kube-bins: skips it, or
   fails it with CI=true, as before), never a hang (``WAIT_SECONDS``).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from .binaries import REPO_ROOT

__all__ = [
    "GO_TOOLS",
    "WAIT_SECONDS",
    "Built",
    "go_tools_needed",
    "missing",
    "module_rank",
    "result",
    "start",
    "wait",
    "waited",
]

SCRIPTS = REPO_ROOT / "scripts"
WAIT_SECONDS = 2400.0  # a cold build of all four on 2 busy cores, with room; then a clear failure
# tool -> the fixtures whose tests need it (a test needs kube-bins when it asks for ``kube`` or is
# marked ``kube``: see fixtures._wants_kube)
GO_TOOLS: dict[str, tuple[str, ...]] = {
    "kube-bins": ("kube",),
    "helm": ("helm",),
    "karpenter": ("karpenter",),
    "promtool": ("promtool",),
}


@dataclass(frozen=True)
class Built:
    """What a tool's script left: its output path (the script's last line) or why it has none."""

    tool: str
    path: str = ""
    error: str = ""
    waited: float = 0.0


_RESULTS: dict[str, Built] = {}


def go_tools_needed(item: pytest.Item, wants_kube: bool) -> tuple[str, ...]:
    names = set(getattr(item, "fixturenames", ()))
    return tuple(
        tool
        for tool, fixtures in GO_TOOLS.items()
        if (tool == "kube-bins" and wants_kube) or (tool != "kube-bins" and names & set(fixtures))
    )


def module_rank(needed: Sequence[str]) -> int:
    """0: waits for no Go tool; 1: for kube-bins only (built first); 2: for another tool."""
    if not needed:
        return 0
    return 1 if set(needed) == {"kube-bins"} else 2


def missing(tools: Sequence[str] = tuple(GO_TOOLS)) -> frozenset[str]:
    """The *tools* not built yet (scripts/build-go-tools.sh --missing: each script's own check; a
    kube-bins that is not built here, KUBEBUILDER_ASSETS or GPUHC_KUBE_NO_BUILD, is never missing).
    All of them when the script cannot say."""
    try:
        proc = subprocess.run(
            ["bash", str(SCRIPTS / "build-go-tools.sh"), "--missing", *tools],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return frozenset(tools)
    if proc.returncode != 0:
        return frozenset(tools)
    return frozenset(proc.stdout.split()) & set(tools)


def start(tools: Sequence[str]) -> str:
    """Start building *tools* in the background (scripts/build-go-tools.sh --background); the
    script's one line, or why it could not start."""
    try:
        proc = subprocess.run(
            ["bash", str(SCRIPTS / "build-go-tools.sh"), "--background", *tools],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not start scripts/build-go-tools.sh: {exc}"
    return (proc.stderr.strip().splitlines() or [f"build-go-tools.sh exited {proc.returncode}"])[-1]


def wait(tool: str, timeout: float = WAIT_SECONDS) -> Built:
    """The tool's script run to its end (it waits for a build under way); cached per session, so a
    failed build is reported to every test that needs it without building again."""
    if tool in _RESULTS:
        return _RESULTS[tool]
    script = SCRIPTS / f"build-{tool}.sh"
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            ["bash", str(script)], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        built = Built(tool, error=f"{script.name} did not finish in {timeout:.0f}s", waited=timeout)
    except OSError as exc:
        built = Built(tool, error=f"cannot run {script.name}: {exc}")
    else:
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            built = Built(tool, error=f"{script.name} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
        else:
            built = Built(tool, path=lines[-1])
    built = Built(built.tool, built.path, built.error, waited=time.monotonic() - t0)
    _RESULTS[tool] = built
    return built


def result(tool: str) -> str:
    """The tool's path for a test; fails the test with the build's words when it could not build."""
    built = wait(tool)
    if built.error:
        pytest.fail(built.error, pytrace=False)
    return built.path


def waited() -> dict[str, Built]:
    return dict(_RESULTS)
