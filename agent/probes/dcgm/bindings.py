"""Find and import NVIDIA's DCGM Python bindings (pydcgm & friends), which are not on PyPI.

Looked for, in order: $GPU_HEALTHCHECK_DCGM_PYTHON (a directory), DCGM 4's
/usr/share/datacenter-gpu-manager-4/bindings/python3, DCGM 3's /usr/local/dcgm/bindings/python3
(dcgm.md §1.1). Tests point the env variable at a fake package with the same call surface.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ENV = "GPU_HEALTHCHECK_DCGM_PYTHON"
DEFAULT_DIRS = (
    Path("/usr/share/datacenter-gpu-manager-4/bindings/python3"),
    Path("/usr/local/dcgm/bindings/python3"),
)
MODULES = ("dcgm_structs", "dcgm_fields", "dcgm_agent", "pydcgm", "DcgmDiag")
DCGM_ST_CONNECTION_NOT_VALID = -21
DCGM_ST_TIMEOUT = -11
DCGM_ST_DIAG_ALREADY_RUNNING = -39
DCGM_FE_NONE, DCGM_FE_GPU, DCGM_FE_SWITCH = 0, 1, 3


class BindingsUnavailable(RuntimeError):
    """The DCGM Python bindings (or libdcgm behind them) cannot be loaded."""


@dataclass(frozen=True)
class Bindings:
    path: str
    dcgm_structs: ModuleType
    dcgm_fields: ModuleType
    dcgm_agent: ModuleType
    pydcgm: ModuleType
    DcgmDiag: ModuleType


def candidate_dirs(env: Mapping[str, str] | None = None) -> list[Path]:
    env = os.environ if env is None else env
    dirs = [Path(env[ENV])] if env.get(ENV) else []
    return dirs + list(DEFAULT_DIRS)


def load_bindings(env: Mapping[str, str] | None = None) -> Bindings:
    """Import the bindings from the first candidate directory that holds pydcgm.py."""
    tried = []
    for d in candidate_dirs(env):
        if not (d / "pydcgm.py").is_file():
            tried.append(str(d))
            continue
        if str(d) not in sys.path:
            sys.path.insert(0, str(d))
        try:
            mods = {name: importlib.import_module(name) for name in MODULES}
        except (
            Exception
        ) as exc:  # the bindings' own import errors (libdcgm loads later, on the first connect)
            raise BindingsUnavailable(f"DCGM bindings in {d} failed to import: {exc}") from exc
        return Bindings(path=str(d), **mods)
    raise BindingsUnavailable(f"DCGM Python bindings not found (set {ENV}); looked in {', '.join(tried)}")


def error_code(exc: BaseException) -> int | None:
    """The DCGM_ST_* value of a dcgm_structs.DCGMError (they carry it as .value)."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None
