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


CORE_ACYCLIC = "core has no import cycle: its modules import each other one way"
# A back edge under TYPE_CHECKING only (the shape of the facts <-> trends cycle that was): it counts.
CORE_BACK_EDGE = (
    "\nfrom typing import TYPE_CHECKING  # noqa\n"
    "if TYPE_CHECKING:\n    from agent.core import findings  # noqa\n"
)
PACKAGES_ACYCLIC = "no other package has an import cycle: its modules import each other one way"
# The shape of the status <-> status_clear circle that was: a section module naming the table's
# row type for its annotations, the table module importing the section.
CLI_BACK_EDGE = (
    "\nfrom typing import TYPE_CHECKING  # noqa\n"
    "if TYPE_CHECKING:\n    from agent.cli.status import render  # noqa\n"
)


def copy_tree(tmp_path: Path) -> None:
    for name in ("agent", "hostengine"):
        shutil.copytree(
            ROOT / name, tmp_path / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")


def verdicts_of(run: subprocess.CompletedProcess[str]) -> dict[str, str]:
    return {
        line.rsplit(" ", 1)[0]: line.rsplit(" ", 1)[1]
        for line in run.stdout.splitlines()
        if line.endswith((" KEPT", " BROKEN"))
    }


def test_each_contract_breaks_on_a_planted_violation(tmp_path: Path) -> None:
    copy_tree(tmp_path)
    clean = lint_imports(tmp_path)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    with (tmp_path / "agent" / "checks" / "gpu.py").open("a") as fh:
        fh.write("\nimport os  # noqa\nimport subprocess  # noqa\n")
    with (tmp_path / "agent" / "probes" / "topo.py").open("a") as fh:
        fh.write("\nfrom agent.reporters import kube_rest  # noqa\n")
    with (tmp_path / "hostengine" / "__init__.py").open("a") as fh:
        fh.write("\nimport agent.engine.engine  # noqa\n")
    with (tmp_path / "agent" / "core" / "severity.py").open("a") as fh:
        fh.write(CORE_BACK_EDGE)
    with (tmp_path / "agent" / "cli" / "status_clear.py").open("a") as fh:
        fh.write(CLI_BACK_EDGE)
    with (tmp_path / "agent" / "reporters" / "active_checks.py").open("a") as fh:
        fh.write("\nfrom agent.reporters import brake  # noqa\n")  # one fleet control leaning on another
    broken = lint_imports(tmp_path)
    assert broken.returncode != 0
    verdicts = verdicts_of(broken)
    assert len(verdicts) == 8 and all(v == "BROKEN" for v in verdicts.values()), broken.stdout


def test_core_is_acyclic_and_a_type_checking_back_edge_breaks_it(tmp_path: Path) -> None:
    """The contract inside agent.core is there and KEPT; a cycle made only of a TYPE_CHECKING import
    (findings imports severity, severity imports findings for its annotations) breaks it alone."""
    copy_tree(tmp_path)
    clean = lint_imports(tmp_path)
    assert verdicts_of(clean).get(CORE_ACYCLIC) == "KEPT", clean.stdout
    with (tmp_path / "agent" / "core" / "severity.py").open("a") as fh:
        fh.write(CORE_BACK_EDGE)
    broken = lint_imports(tmp_path)
    verdicts = verdicts_of(broken)
    assert verdicts[CORE_ACYCLIC] == "BROKEN", broken.stdout
    assert [name for name, v in verdicts.items() if v == "BROKEN"] == [CORE_ACYCLIC], broken.stdout
    assert "- .severity -> .findings (1 import)" in broken.stdout, broken.stdout


def test_cli_is_acyclic_and_a_type_checking_back_edge_breaks_it(tmp_path: Path) -> None:
    """The contract over the other packages is KEPT (no status <-> status_clear circle); a section of
    `status` importing the table module back, for its annotations only, breaks it alone."""
    copy_tree(tmp_path)
    clean = lint_imports(tmp_path)
    assert verdicts_of(clean).get(PACKAGES_ACYCLIC) == "KEPT", clean.stdout
    with (tmp_path / "agent" / "cli" / "status_clear.py").open("a") as fh:
        fh.write(CLI_BACK_EDGE)
    broken = lint_imports(tmp_path)
    verdicts = verdicts_of(broken)
    assert [name for name, v in verdicts.items() if v == "BROKEN"] == [PACKAGES_ACYCLIC], broken.stdout
    assert "No cycles are allowed in agent.cli." in broken.stdout, broken.stdout
    assert "- .status_clear -> .status (1 import)" in broken.stdout, broken.stdout
