"""The suite several test files at a time: pytest-xdist workers, each with its own control plane.

``make test`` runs pytest with ``-n`` (pytest-xdist). Each worker is a pytest session of its own,
so the session fixtures (``kube``, ``kube_controllers``) start one etcd + kube-apiserver per worker,
on first use: a test never shares its server with a test running at the same time, and the tests
that create cluster-scoped objects (Nodes, admission policies, DeviceTaintRules) or start clusters
of their own need no care and no edit. What a single process guaranteed still holds:

- whole files go to a worker (``--dist loadfile``): a module's fixtures (its own cluster, its
  installed manifests) are set up once, and its tests run in their order on one server;
- files go out in the collected order (``--no-loadscope-reorder``), which go_tools sets: the
  files that need no Go tool first, then those that need kube-bins, then the rest; so the builds
  still go on beside the first ones, and each worker waits for a tool before its first test that
  needs it (tests/kubeenv/go_tools.py).

pytest-xdist's own default (``--dist load``, files split test by test and reordered by size) would
break both; ``-n`` alone here means the two settings above. Workers report what they waited for and
how fast their servers started; the controller prints it in its summary.
"""

from __future__ import annotations

from typing import Any

import pytest

__all__ = ["SUMMARY_KEY", "configure", "is_worker", "publish", "pytest_testnodedown", "worker_lines"]

SUMMARY_KEY = "gpuhc_summary"  # a worker's summary lines, in its workeroutput
_WORKER_LINES = pytest.StashKey[list[str]]()


def configure(config: pytest.Config) -> None:
    """With ``-n``: whole files, in the collected order (see the module's docstring)."""
    if getattr(config.option, "dist", "no") == "load":
        config.option.dist = "loadfile"
    if getattr(config.option, "dist", "no") in ("loadfile", "loadscope"):
        config.option.loadscopereorder = False


def is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def publish(config: pytest.Config, lines: list[str]) -> bool:
    """On a worker: hand *lines* to the controller's summary; False elsewhere."""
    if not is_worker(config):
        return False
    config.workeroutput[SUMMARY_KEY] = lines  # type: ignore[attr-defined]
    return True


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """On the controller: keep a finished worker's summary lines."""
    lines = getattr(node, "workeroutput", {}).get(SUMMARY_KEY, [])
    wid = getattr(node, "gateway", None)
    name = getattr(wid, "id", "worker")
    node.config.stash.setdefault(_WORKER_LINES, []).extend(f"[{name}] {line}" for line in lines)


def worker_lines(config: pytest.Config) -> list[str]:
    return sorted(config.stash.get(_WORKER_LINES, []))
