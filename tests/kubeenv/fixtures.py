"""pytest fixtures for a real etcd + kube-apiserver (the envtest way). Loaded by tests/conftest.py.

Fixtures
    kube                (session)  KubeEnv: a running control plane + helpers
    kube_controllers    (session)  the same KubeEnv, with kube-controller-manager started too
    kube_node_name      (function) a fresh unique Node name
    kube_namespace      (function) a fresh Namespace, created (deleted afterwards)
    gpu_node            (function) factory: gpu_node(**make_gpu_node kwargs) -> V1Node, deleted afterwards

Binaries: $KUBEBUILDER_ASSETS, else built once by scripts/build-kube-bins.sh (triggered here after
collection when ``kube`` tests are selected, unless GPUHC_KUBE_NO_BUILD=1). Missing toolchain:
skip with one line, except with CI=true, where it is a failure.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any, NoReturn

import pytest

from .binaries import (
    UNAVAILABLE,
    KubeBinaries,
    KubeUnavailable,
    build_binaries,
    default_bin_dir,
    find_binaries,
    unavailable_message,
)
from .env import KubeEnv, unique_name
from .server import ControlPlane, ControlPlaneError

__all__ = [
    "gpu_node",
    "kube",
    "kube_controllers",
    "kube_namespace",
    "kube_node_name",
    "pytest_collection_finish",
    "pytest_configure",
    "pytest_runtest_makereport",
    "pytest_terminal_summary",
]

MARKER = "kube: runs against a real etcd + kube-apiserver (tests/kubeenv; builds them on first use)"

_BUILD_ERROR = pytest.StashKey[str]()
_BUILD_SECONDS = pytest.StashKey[float]()
_ENV = pytest.StashKey[KubeEnv]()


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _build_allowed() -> bool:
    return os.environ.get("GPUHC_KUBE_NO_BUILD", "").strip().lower() not in ("1", "true", "yes")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER)


def _wants_kube(item: pytest.Item) -> bool:
    return item.get_closest_marker("kube") is not None or "kube" in getattr(item, "fixturenames", ())


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the binaries before the first test (outside any per-test timeout) when needed."""
    config = session.config
    if config.option.collectonly or not any(_wants_kube(i) for i in session.items):
        return
    try:
        if find_binaries() is not None or not _build_allowed():
            return
    except KubeUnavailable as exc:  # a broken KUBEBUILDER_ASSETS
        config.stash[_BUILD_ERROR] = str(exc)
        return
    tr = config.pluginmanager.get_plugin("terminalreporter")
    capman = config.pluginmanager.get_plugin("capturemanager")
    if tr is not None:
        tr.write_line(
            "kube tests selected: building etcd, kube-apiserver, kube-controller-manager and "
            "kubectl from the Go module proxy (one-off per machine) ...",
            yellow=True,
        )
    t0 = time.monotonic()
    try:
        if capman is not None:
            with capman.global_and_fixture_disabled():
                build_binaries(sys.stderr)
        else:
            build_binaries(sys.stderr)
    except KubeUnavailable as exc:
        config.stash[_BUILD_ERROR] = unavailable_message(str(exc))
    finally:
        config.stash[_BUILD_SECONDS] = time.monotonic() - t0


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    lines = []
    if _BUILD_SECONDS in config.stash:
        lines.append(f"kube binaries: build took {config.stash[_BUILD_SECONDS]:.0f}s")
    env = config.stash.get(_ENV, None)
    if env is not None:
        cm = env.plane.controller_manager_start_seconds
        lines.append(
            f"kube: etcd + kube-apiserver {env.version} ({env.binaries.source}, {env.binaries.dir}) "
            f"ready in {env.start_seconds:.1f}s" + (f"; kube-controller-manager in {cm:.1f}s" if cm else "")
        )
    for line in lines:
        terminalreporter.write_line(line)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Report every "kube-apiserver not available" skip at one place, so ``-ra`` shows ONE line."""
    rep: pytest.TestReport = yield
    if rep.skipped and isinstance(rep.longrepr, tuple) and UNAVAILABLE in str(rep.longrepr[2]):
        rep.longrepr = (__file__, _unavailable.__code__.co_firstlineno, rep.longrepr[2])
    return rep


def _unavailable(reason: str) -> NoReturn:
    if _in_ci():
        pytest.fail(
            f"{reason} (CI=true: a Kubernetes API server that cannot start is a failure)", pytrace=False
        )
    pytest.skip(reason)


def _binaries(config: pytest.Config) -> KubeBinaries:
    if _BUILD_ERROR in config.stash:
        _unavailable(config.stash[_BUILD_ERROR])
    try:
        found = find_binaries()
        if found is None and _build_allowed() and _BUILD_SECONDS not in config.stash:
            build_binaries(sys.stderr)  # not built after collection (e.g. the fixture used unmarked)
            found = find_binaries()
    except KubeUnavailable as exc:
        _unavailable(unavailable_message(str(exc)))
    if found is None:
        why = "GPUHC_KUBE_NO_BUILD=1" if not _build_allowed() else "the build left none"
        _unavailable(unavailable_message(f"not in {default_bin_dir()}; {why}"))
    return found


@pytest.fixture(scope="session")
def kube(request: pytest.FixtureRequest) -> Iterator[KubeEnv]:
    """A real etcd + kube-apiserver on 127.0.0.1 for the whole session (see KubeEnv)."""
    plane = ControlPlane(_binaries(request.config))
    try:
        try:
            plane.start()
        except ControlPlaneError as exc:
            pytest.fail(str(exc), pytrace=False)
        env = KubeEnv(plane)
        request.config.stash[_ENV] = env
        yield env
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def kube_controllers(kube: KubeEnv) -> KubeEnv:
    """``kube`` plus kube-controller-manager running the serviceaccount, namespace and root-CA
    publisher controllers only (no node-lifecycle/taint controllers). Stopped with ``kube``."""
    try:
        kube.start_controller_manager()
    except ControlPlaneError as exc:
        pytest.fail(str(exc), pytrace=False)
    return kube


@pytest.fixture
def kube_node_name(request: pytest.FixtureRequest) -> str:
    """A Node name no other test uses (derived from the test's name)."""
    return unique_name(request.node.name.split("[")[0].removeprefix("test_"))


@pytest.fixture
def kube_namespace(kube: KubeEnv, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh Namespace for this test; deleted afterwards."""
    name = unique_name(request.node.name.split("[")[0].removeprefix("test_"), max_len=40)
    kube.ensure_namespace(name)
    yield name
    kube.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture
def gpu_node(kube: KubeEnv, kube_node_name: str) -> Iterator[Callable[..., Any]]:
    """Factory: ``gpu_node(instance_type=..., gpus=..., labels=..., taints=..., name=...)`` creates a
    GPU-looking Node (first call named ``kube_node_name``) and deletes every one at teardown."""
    made: list[str] = []

    def make(name: str | None = None, **kwargs: Any) -> Any:
        name = name or (kube_node_name if not made else unique_name(kube_node_name[:40]))
        node = kube.make_gpu_node(name, **kwargs)
        made.append(name)
        return node

    yield make
    for name in made:
        kube.delete_node(name)
