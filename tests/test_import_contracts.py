"""The import contracts (.importlinter) break on a planted violation: `make lint` can fail for them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(tree / ".importlinter"), "--no-cache"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_each_contract_breaks_on_a_planted_violation(tmp_path: Path) -> None:
    for name in ("agent", "hostengine"):
        shutil.copytree(
            ROOT / name, tmp_path / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    clean = lint_imports(tmp_path)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    with (tmp_path / "agent" / "checks" / "gpu.py").open("a") as fh:
        fh.write("\nimport os  # noqa\nimport subprocess  # noqa\n")
    with (tmp_path / "agent" / "probes" / "topo.py").open("a") as fh:
        fh.write("\nfrom agent.reporters import kube_rest  # noqa\n")
    with (tmp_path / "hostengine" / "__init__.py").open("a") as fh:
        fh.write("\nimport agent.engine.engine  # noqa\n")
    broken = lint_imports(tmp_path)
    assert broken.returncode != 0
    verdicts = {
        line.rsplit(" ", 1)[0]: line.rsplit(" ", 1)[1]
        for line in broken.stdout.splitlines()
        if line.endswith((" KEPT", " BROKEN"))
    }
    assert len(verdicts) == 5 and all(v == "BROKEN" for v in verdicts.values()), broken.stdout
