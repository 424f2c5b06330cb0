"""How long each test file took in the last run here, so that the next run starts the longest first.

Workers take whole files (parallel.py), so a run ends when its last file does: a 150 s file handed
out last sets the tail while the other workers sit idle. The controller (or the one process, without
``-n``) adds up each file's setup, call and teardown times and keeps them in
``.cache/test-file-seconds.json`` (this machine's figures: not in git); the next collection orders
the files of each rank (go_tools.module_rank) longest first. A file without a figure (a new one,
or the first run on a clone) keeps its collected place after those that have one. A run of some
files only updates those files.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

from .binaries import REPO_ROOT

__all__ = ["RECORD", "load", "record_report", "save"]

RECORD = REPO_ROOT / ".cache" / "test-file-seconds.json"
_SECONDS: defaultdict[str, float] = defaultdict(float)  # this process's run: one session each


def load(path: Path = RECORD) -> dict[str, float]:
    """File → seconds from the last run; empty when there is none or it cannot be read."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: float(v) for k, v in data.items() if isinstance(k, str) and isinstance(v, (int, float))}


def record_report(report: pytest.TestReport) -> None:
    """Add one phase's duration to its file's total."""
    _SECONDS[report.nodeid.split("::", 1)[0]] += report.duration


def save(path: Path = RECORD) -> None:
    """Merge this run's totals into the record (written whole, then renamed into place)."""
    if not _SECONDS:
        return
    merged = load(path) | {k: round(v, 2) for k, v in _SECONDS.items()}
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(dict(sorted(merged.items())), indent=0) + "\n")
        tmp.replace(path)
