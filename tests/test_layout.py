"""The tree is the pipeline: the layer folders are the ones docs/architecture.md names, and every
module of a layer is named in its row there (a new module is placed and described, not dropped in),
and no module is longer than MAX_LINES."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

from agent.checks.registry import CHECKS

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("core", "config", "probes", "checks", "engine", "reporters", "cli")


def architecture_rows() -> dict[str, str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    return dict(re.findall(r"^\| `agent/(\w+)/` \| (.+) \|$", text, flags=re.M))


def test_agent_holds_the_layer_folders_and_nothing_flat() -> None:
    folders = {p.name for p in (ROOT / "agent").iterdir() if p.is_dir() and p.name != "__pycache__"}
    flat = {p.name for p in (ROOT / "agent").glob("*.py")}
    assert folders == set(LAYERS)
    assert flat == {"__init__.py"}
    assert set(architecture_rows()) == set(LAYERS)


def test_every_module_is_named_in_its_layer_row() -> None:
    """Check modules are documented by the checks they hold (the next test)."""
    rows = architecture_rows()
    families = {spec.fn.__module__.rsplit(".", 1)[1] for spec in CHECKS}
    for layer in LAYERS:
        named = re.findall(r"`([\w*/]+)`", rows[layer])
        for path in sorted((ROOT / "agent" / layer).iterdir()):
            name = path.stem if path.suffix == ".py" else path.name
            if name.startswith("__") or path.name == "__pycache__" or path.name == "defaults":
                continue
            if layer == "checks" and name in families:
                continue
            wanted = (name, f"{name}/", f"cli/{name}.py")
            assert any(fnmatch.fnmatch(w, pat) for w in wanted for pat in named), f"agent/{layer}/{path.name}"


def test_the_docs_checks_table_lists_every_registered_check() -> None:
    """In report order: a new check gets its row, a removed one loses it (docs/checks.md)."""
    text = (ROOT / "docs" / "checks.md").read_text()
    table = text[text.index("### Checks") : text.index("### Instance profiles")]
    assert re.findall(r"^\| `([\w.-]+)` \|", table, flags=re.M) == [spec.name for spec in CHECKS]


MAX_LINES = 400  # a module a reader takes in at once; past it, it holds more than one thing


def test_no_module_is_over_max_lines() -> None:
    """No exceptions: a module past MAX_LINES is split, not listed."""
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted((ROOT / "agent").rglob("*.py"))
    }
    over = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert not over, f"over {MAX_LINES} lines: {over}"


def test_the_engine_runs_tiers_and_decides_the_verdict_in_under_250_lines() -> None:
    """Building the Marks lives in engine/marks_builder.py, reading inputs in engine/input_reads.py:
    the module every feature used to edit stays small enough to read at once."""
    lines = len((ROOT / "agent" / "engine" / "engine.py").read_text().splitlines())
    assert lines < 250, f"agent/engine/engine.py has {lines} lines"
