"""Shared pytest configuration, and ``cfg``: the one way a test builds the agent's Config."""

import copy
import functools
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings

from agent.config import (
    CONFIG_YAML,
    DCGM_INCIDENTS_YAML,
    PROFILES_YAML,
    XID_CATALOG_YAML,
    Config,
    parse_config,
    yaml_safe,
)
from agent.core.repair_budget import BudgetPolicy, WavePolicy
from tests.kubeenv.fixtures import *  # noqa: F403  (real kube-apiserver fixtures)

# No time limit per example: a property test asserts what the parser does, never how fast (speed is
# measured by bench/); Hypothesis' default 200 ms deadline failed the fuzz tests on a loaded machine.
hypothesis_settings.register_profile("gpu-healthcheck", deadline=None)
hypothesis_settings.load_profile("gpu-healthcheck")

FAKE_DCGM = Path(__file__).parent / "fakes" / "dcgm"
FAKE_LIBDCGM_C = FAKE_DCGM / "libdcgm" / "fake_libdcgm.c"
CACHE = Path(__file__).parent.parent / ".cache" / "fake-libdcgm"
CONFIG_DIR = Path(__file__).resolve().parent.parent / "config"  # the shipped ConfigMap's files


@functools.cache
def _shipped(name: str) -> Any:
    return yaml_safe.load((CONFIG_DIR / name).read_text(encoding="utf-8"))


def cfg(
    doc: Mapping[str, Any] | None = None,
    *,
    profiles: Mapping[str, Any] | None = None,
    rules: bool = True,
) -> Config:
    """The Config a test judges with: config/ as shipped (config.yaml and its three tables), as the
    agent loads it. *doc* stands in for config.yaml (``{}``: every default); *profiles* adds or
    replaces instance profiles by name; the check and rule names are checked against the registry as
    every entry point of the agent does, unless ``rules=False``."""
    from agent.checks.registry import RULE_BOOK

    profiles_doc = copy.deepcopy(_shipped(PROFILES_YAML))
    profiles_doc["profiles"].update(copy.deepcopy(dict(profiles or {})))
    return parse_config(
        copy.deepcopy(dict(doc) if doc is not None else _shipped(CONFIG_YAML) or {}),
        profiles_doc,
        copy.deepcopy(_shipped(XID_CATALOG_YAML)),
        copy.deepcopy(_shipped(DCGM_INCIDENTS_YAML)),
        rules=RULE_BOOK if rules else None,
    )


@functools.cache
def shipped() -> Config:
    """``cfg()`` once: the shipped config, for a part a test builds on it (a Config is never changed)."""
    return cfg()


def node_cfg(
    budget: BudgetPolicy | None = None, wave: WavePolicy | None = None, *, prefix: str = "", **node: Any
) -> Config:
    """``cfg`` with these ``node.*`` keys (as config.yaml spells them) over the defaults, for a part
    built on the Config it reads (a LivePart); *budget* and *wave* are written back as
    node.repairBudget and node.waveHold, *prefix* as the prefix ("": the default)."""
    if budget is not None:
        node["repairBudget"] = {
            "maxNodes": budget.max_nodes,
            "maxFraction": budget.max_fraction,
            "windowMinutes": budget.window_s / 60,
            "perLabel": budget.per_label,
        }
    if wave is not None:
        node["waveHold"] = {
            "minNodes": wave.min_nodes,
            "minFraction": wave.min_fraction,
            "windowMinutes": wave.window_s / 60,
        }
    return cfg({"node": node, **({"prefix": prefix} if prefix else {})})


BRAKE_KEYS = {
    "selectors": "gpuNodeSelector",
    "max_fraction": "maxTaintedFraction",
    "max_nodes": "maxTaintedNodes",
    "min_severity": "taintMinSeverity",
}


def brake_cfg(**limits: Any) -> Config:
    """The Config a test's Brake reads: its limits by the names above, written as their node.* keys
    over the defaults, and no instance profiles (the GPU nodes are the selectors' alone)."""
    node = {BRAKE_KEYS[k]: list(v) if k == "selectors" else v for k, v in limits.items()}
    return parse_config({"node": node})


def brake_kw(kw: dict[str, Any]) -> dict[str, Any]:
    """A Brake's keyword arguments with its limits (brake_cfg's names) turned into its ``cfg``."""
    limits = {k: kw.pop(k) for k in BRAKE_KEYS if k in kw}
    return {**kw, "cfg": brake_cfg(**limits)}


def live_cfg(
    timeout_s: float = 30.0, nvml_timeout_s: float | None = None, check_timeout_s: float = 60.0
) -> Config:
    """The Config a test's LiveSource reads: its timeouts (NVML's: nvidia-smi's unless given), set in
    the defaults past the schema, whose 1 s minimum is too slow for a test of a hung GPU."""
    raw = copy.deepcopy(parse_config({}).raw)
    nvml = timeout_s if nvml_timeout_s is None else nvml_timeout_s
    raw["timeouts"] = {"nvidiaSmi": timeout_s, "nvml": nvml, "check": check_timeout_s}
    return Config(raw=raw)


@pytest.fixture(name="cfg", scope="session")
def shipped_cfg() -> Config:
    """``cfg()`` as a fixture: the shipped config, for a test that takes ``cfg`` (one per session:
    a Config is not changed by what judges with it)."""
    return cfg()


def build_fake_library(source_c: Path, soname: str, cache: Path) -> Path:
    """Compile a fake library's C source into <dir>/<soname> (with that soname), cached by the
    source's hash; returns <dir>. Skips the test when no C compiler is installed."""
    out = cache / hashlib.sha256(source_c.read_bytes()).hexdigest()[:16]
    if (out / soname).is_file():
        return out
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip(f"no C compiler to build the fake {soname}")
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f"{soname}.{os.getpid()}"
    cmd = [cc, "-O1", "-Wall", "-Werror", "-shared", "-fPIC", f"-Wl,-soname,{soname}"]
    subprocess.run([*cmd, "-o", str(tmp), str(source_c), "-lpthread"], check=True)
    tmp.replace(out / soname)
    return out


def build_fake_libdcgm() -> Path:
    """tests/fakes/dcgm/libdcgm/fake_libdcgm.c as libdcgm.so.4; returns its directory."""
    return build_fake_library(FAKE_LIBDCGM_C, "libdcgm.so.4", CACHE)


FAKE_LIBNVML_C = Path(__file__).parent / "fakes" / "nvml" / "fake_libnvidia_ml.c"
NVML_CACHE = Path(__file__).parent.parent / ".cache" / "fake-libnvidia-ml"


def build_fake_libnvml() -> Path:
    """tests/fakes/nvml/fake_libnvidia_ml.c as libnvidia-ml.so.1; returns its directory."""
    return build_fake_library(FAKE_LIBNVML_C, "libnvidia-ml.so.1", NVML_CACHE)


@pytest.fixture(scope="session")
def fake_libnvml_dir() -> Path:
    return build_fake_libnvml()


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch, fake_libnvml_dir: Path, tmp_path: Path) -> Iterator[Any]:
    """The fake libnvidia-ml.so.1 loaded into this process under its soname, so that the real pynvml's
    CDLL("libnvidia-ml.so.1") finds it (a library already loaded is found by its soname before any
    search); its configuration file in tmp_path (FAKE_NVML_CONFIG). Yields the FakeLib controls, with
    the agent's NVML session closed and the fake's counts reset before and after."""
    from agent.probes.nvml_session import SESSION
    from tests.fakes.nvml.fake_nvml import FakeLib

    lib = FakeLib(fake_libnvml_dir / "libnvidia-ml.so.1", tmp_path / "fake-nvml.conf")
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(lib.path))
    SESSION.close()
    lib.reset()
    yield lib
    lib.hold(False)
    SESSION.close()
    lib.reset()


@pytest.fixture(scope="session")
def fake_libdcgm_dir() -> Path:
    return build_fake_libdcgm()


@pytest.fixture
def fake_dcgm(monkeypatch: pytest.MonkeyPatch, fake_libdcgm_dir: Path) -> Iterator[Any]:
    """Our DCGM binding mirror (tests/fakes/dcgm) over our fake libdcgm.so.4, found the way DCGM's own are:
    the bindings through the loader's env override, the library through LD_LIBRARY_PATH when the first
    DcgmHandle is built. Yields the fake engine's control module, reset before and after.

    $GPU_HEALTHCHECK_TEST_DCGM_BINDINGS names another bindings directory for the run, e.g. NVIDIA's
    own (DCGM's testing/python3 at the tag the images pin; never copied into this repository)."""
    from agent.probes.dcgm.bindings import ENV, load_bindings

    bindings = os.environ.get("GPU_HEALTHCHECK_TEST_DCGM_BINDINGS") or str(FAKE_DCGM)
    monkeypatch.setenv(ENV, bindings)
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{fake_libdcgm_dir}:{os.environ.get('LD_LIBRARY_PATH', '')}")
    load_bindings()
    if str(FAKE_DCGM) not in sys.path:  # the fake engine's controls, after the bindings on the path
        sys.path.append(str(FAKE_DCGM))
    import fake_engine  # type: ignore[import-not-found]

    fake_engine.reset()
    yield fake_engine
    fake_engine.hold_diag(False)
    fake_engine.reset()
