"""pytest fixtures for a real etcd + kube-apiserver (the envtest way). Loaded by tests/conftest.py.

Fixtures
    kube                (session)  KubeEnv: a running control plane + helpers
    kube_controllers    (session)  the same KubeEnv, with kube-controller-manager started too
    kube_node_name      (function) a fresh unique Node name
    kube_namespace      (function) a fresh Namespace, created (deleted afterwards)
    gpu_node            (function) factory: gpu_node(**make_gpu_node kwargs) -> V1Node, deleted afterwards

Binaries: $KUBEBUILDER_ASSETS, else built once by scripts/build-kube-bins.sh, with the other Go tools
the selected tests need, in the background from the end of collection (tests/kubeenv/go_tools.py:
the tests that need none run first), unless GPUHC_KUBE_NO_BUILD=1. Missing toolchain: skip with one
line, except with CI=true, where it is a failure.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Generator, Iterator
from typing import Any, NoReturn

import pytest

from . import file_times, go_tools, parallel
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
from .parallel import pytest_testnodedown
from .server import ControlPlane, ControlPlaneError

__all__ = [
    "_no_fleet_records_from_earlier_files",
    "gpu_node",
    "kube",
    "kube_controllers",
    "kube_namespace",
    "kube_node_name",
    "pytest_collection_finish",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "pytest_configure_node",
    "pytest_runtest_logreport",
    "pytest_runtest_makereport",
    "pytest_runtest_protocol",
    "pytest_sessionfinish",
    "pytest_terminal_summary",
    "pytest_testnodedown",
]

MARKER = "kube: runs against a real etcd + kube-apiserver (tests/kubeenv; builds them on first use)"

_BUILD_ERROR = pytest.StashKey[str]()
_BUILD_SECONDS = pytest.StashKey[float]()
_ENV = pytest.StashKey[KubeEnv]()
_ORDER_STASH = pytest.StashKey[dict[str, Any]]()


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _build_allowed() -> bool:
    return os.environ.get("GPUHC_KUBE_NO_BUILD", "").strip().lower() not in ("1", "true", "yes")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER)
    parallel.configure(config)


def _wants_kube(item: pytest.Item) -> bool:
    return item.get_closest_marker("kube") is not None or "kube" in getattr(item, "fixturenames", ())


def _tools(item: pytest.Item) -> tuple[str, ...]:
    return go_tools.go_tools_needed(item, _wants_kube(item))


_ORDER_KEY = "gpuhc_order"  # in a worker's workerinput: what orders the files, read once for all


def _order_inputs(config: pytest.Config) -> tuple[dict[str, float], frozenset[str]]:
    """The files' last durations and the Go tools still to build. Read once by the controller and
    handed to every worker, so that all collect the files in the same order whatever a build or
    another session writes meanwhile (pytest-xdist refuses workers that collected differently)."""
    given = getattr(config, "workerinput", {}).get(_ORDER_KEY)
    if given is not None:
        return dict(given["seconds"]), frozenset(given["missing"])
    return file_times.load(), go_tools.missing()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """On the controller: what orders the files, for each worker (_order_inputs)."""
    config = node.config
    if _ORDER_KEY not in config.stash.get(_ORDER_STASH, {}):
        seconds, missing = _order_inputs(config)
        config.stash[_ORDER_STASH] = {_ORDER_KEY: {"seconds": seconds, "missing": sorted(missing)}}
    node.workerinput[_ORDER_KEY] = config.stash[_ORDER_STASH][_ORDER_KEY]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The modules that need no Go tool still to build first, then those that wait for kube-bins
    only, then the rest, so that the tools build in the background while the first ones run; within
    each group (one group once all are built), the longest in the last run first (file_times), then
    the rest in collected order."""
    seconds, missing = _order_inputs(config)
    rank: dict[str, int] = {}
    for item in items:
        mod = item.nodeid.split("::", 1)[0]
        waits_for = [tool for tool in _tools(item) if tool in missing]
        rank[mod] = max(rank.get(mod, 0), go_tools.module_rank(waits_for))

    def key(item: pytest.Item) -> tuple[int, float]:
        mod = item.nodeid.split("::", 1)[0]
        return rank[mod], -seconds.get(mod, 0.0)

    items.sort(key=key)  # stable: a file's tests keep their order


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start building the Go tools the selected tests need, in the background (scripts/build-go-tools.sh)."""
    config = session.config
    if config.option.collectonly:
        return
    needed = {tool for item in session.items for tool in _tools(item)}
    if "kube-bins" in needed:
        try:
            if find_binaries() is not None or not _build_allowed():
                needed.discard("kube-bins")
        except KubeUnavailable as exc:  # a broken KUBEBUILDER_ASSETS
            config.stash[_BUILD_ERROR] = str(exc)
            needed.discard("kube-bins")
    if not needed:
        return
    line = go_tools.start([t for t in go_tools.GO_TOOLS if t in needed])
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None and not parallel.is_worker(config) and "all built" not in line:
        line = line.removeprefix("build-go-tools: ")
        tr.write_line(f"{line}; the tests that need them run last", yellow=True)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    """Before the first test that needs a Go tool, outside its timeout: wait for the tool's build."""
    for tool in _tools(item):
        if tool in go_tools.waited():
            continue
        if tool == "kube-bins":
            try:
                if find_binaries() is not None or not _build_allowed():
                    continue
            except KubeUnavailable:
                continue  # reported by the kube fixture
        _announce(item.config, f"waiting for {tool} (scripts/build-{tool}.sh) ...")
        built = go_tools.wait(tool)
        if tool == "kube-bins":
            item.config.stash[_BUILD_SECONDS] = built.waited
            if built.error:
                item.config.stash[_BUILD_ERROR] = unavailable_message(built.error)
    return (yield)


def _announce(config: pytest.Config, line: str) -> None:
    tr = config.pluginmanager.get_plugin("terminalreporter")
    capman = config.pluginmanager.get_plugin("capturemanager")
    if tr is None or parallel.is_worker(config):  # a worker's output reaches no one
        return
    with capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext():
        if tr._tw.width_of_current_line:  # after the progress dots
            tr.write("\n")
        tr.write_line(line, yellow=True)


def _summary(config: pytest.Config) -> list[str]:
    lines = []
    built = go_tools.waited()
    if built:
        said = (f"{b.tool} {'FAILED' if b.error else 'ready'} after {b.waited:.0f}s" for b in built.values())
        lines.append("Go tools (waited for): " + ", ".join(said))
    env = config.stash.get(_ENV, None)
    if env is not None:
        cm = env.plane.controller_manager_start_seconds
        lines.append(
            f"kube: etcd + kube-apiserver {env.version} ({env.binaries.source}, {env.binaries.dir}) "
            f"ready in {env.start_seconds:.1f}s" + (f"; kube-controller-manager in {cm:.1f}s" if cm else "")
        )
    return lines


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not parallel.publish(session.config, _summary(session.config)):  # a worker's, for the controller
        file_times.save()  # the controller's (or the one process's): every worker's reports


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    file_times.record_report(report)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    for line in _summary(config) + parallel.worker_lines(config):
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


@pytest.fixture(scope="module", autouse=True)
def _no_fleet_records_from_earlier_files(request: pytest.FixtureRequest) -> None:
    """Each test file starts on this worker's API server without the fleet records of the files
    before it: a file's brake slots or repair-budget marks would hold back the next one's taints,
    and which file comes before which depends on the worker and the last run's times (file_times)."""
    env = request.config.stash.get(_ENV, None)
    if env is not None:
        env.delete_fleet_records()


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
