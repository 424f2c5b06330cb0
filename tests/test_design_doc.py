"""The design is in the repository: DESIGN.md exists, every `DESIGN.md §N` pointer of the code, the
manifests and the docs names one of its numbered headings, and no code comment or docstring carries an
issue number instead of saying what it means."""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "DESIGN.md"

# Where pointers live: the code, the tests and benches, the install and the docs.
SCANNED_DIRS = (
    "agent",
    "hostengine",
    "sdcprobe",
    "tests",
    "bench",
    "scripts",
    "config",
    "charts",
    "manifests",
    "overlays",
    "examples",
    "tools",
    ".ci",
    "docs",
)
SCANNED_FILES = (
    "README.md",
    "CHANGELOG.md",
    ".importlinter",
    "Makefile",
    "pyproject.toml",
    "Dockerfile.agent",
    "Dockerfile.hostengine",
    "Dockerfile.sdcprobe",
)
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".txt", ".tpl", ".sh", ".toml", ".cfg", ".ini", ".c", ".go"}
TEXT_NAMES = {"Kustomization", "Makefile", "run"}
# Recorded data (never edited, never a pointer), and agent/config/defaults, a link to config/.
SKIPPED_DIRS = {"fixtures", "snapshots", "defaults", "__pycache__", ".venv", ".cache"}
# Code whose comments and docstrings must say what they mean, not which issue asked for them.
CODE_DIRS = ("agent", "hostengine", "sdcprobe", "bench")

HEADING = re.compile(r"^#{2,4}\s+(\d+[a-z]?(?:\.\d+)*)\.?\s", re.M)
POINTER = re.compile(r"DESIGN(?:\.md)?\s+§[\w.]+(?:\s*(?:,|/|and)\s*§[\w.]+)*")
SECTION = re.compile(r"§(\d+[a-z]?(?:\.\d+)*)")
ISSUE = re.compile(r"\bissues?\s?#?\d+", re.I)


def sections(design: str) -> list[str]:
    """The numbers of DESIGN.md's headings: `## 3. Severity` is 3, `### 6.1 The brake` is 6.1."""
    return HEADING.findall(design)


def pointers(text: str) -> list[str]:
    """The sections a text points to: `DESIGN.md §4, §6.1` is 4 and 6.1 (`DESIGN §3` too)."""
    return [s for p in POINTER.findall(text) for s in SECTION.findall(p)]


def dangling(text: str, known: set[str]) -> list[str]:
    return [s for s in pointers(text) if s not in known]


def scanned() -> Iterator[Path]:
    for name in SCANNED_FILES:
        if (ROOT / name).is_file():
            yield ROOT / name
    for top in SCANNED_DIRS:
        for path in sorted((ROOT / top).rglob("*")):
            rel = path.relative_to(ROOT).parts
            if SKIPPED_DIRS & set(rel) or not path.is_file() or path.is_symlink():
                continue
            if path.suffix in TEXT_SUFFIXES or path.name in TEXT_NAMES:
                yield path


def design_text() -> str:
    return DESIGN.read_text(encoding="utf-8")


def test_design_doc_exists_with_unique_numbered_sections() -> None:
    assert DESIGN.is_file(), "DESIGN.md is the project's design: it belongs at the repository root"
    numbers = sections(design_text())
    assert len(numbers) == len(set(numbers)), "a section number used twice"
    tops = [n for n in numbers if "." not in n]
    assert tops == [str(i) for i in range(1, len(tops) + 1)], "top-level sections numbered 1, 2, 3, ..."
    for sub in (n for n in numbers if "." in n):
        assert sub.split(".")[0] in tops, f"§{sub} under no top-level section"


def test_every_pointer_in_the_tree_names_a_section() -> None:
    known = set(sections(design_text()))
    found: dict[str, list[str]] = {}
    missing = []
    for path in scanned():
        text = path.read_bytes().decode("utf-8", "replace")
        rel = str(path.relative_to(ROOT))
        found[rel] = pointers(text)
        missing += [f"{rel}: §{s}" for s in dangling(text, known)]
    assert not missing, "pointers to no section of DESIGN.md:\n" + "\n".join(missing)
    # The scan sees the pointers it is meant to see (a broken scan would pass on nothing).
    assert found[".importlinter"] == ["2"]
    assert "4" in found["agent/core/node_keys.py"]
    assert sum(len(v) for v in found.values()) >= 15


def test_design_doc_refers_only_to_its_own_sections() -> None:
    text = design_text()
    known = set(sections(text))
    assert [s for s in SECTION.findall(text) if s not in known] == []


def test_a_dangling_pointer_is_found() -> None:
    """Built from pieces, so that the tree scan above does not meet these pointers in this file."""
    known = set(sections(design_text()))
    sign = "§"
    assert dangling(f"see DESIGN.md {sign}99 for why", known) == ["99"]
    assert dangling(f"(DESIGN.md {sign}4, {sign}12a)", known) == ["12a"]
    assert dangling(f"DESIGN {sign}6.9", known) == ["6.9"]
    assert dangling(f"(DESIGN.md {sign}4, {sign}6.1)", known) == []
    assert pointers(f"a dcgm.md {sign}3.2 reference") == []  # other documents' sections are theirs


def test_key_pointers_point_to_their_subject() -> None:
    """A section number that moved to another subject resolves, and is wrong: the main ones say so."""
    titles = dict(re.findall(r"^#{2,4}\s+(\d+[a-z]?(?:\.\d+)*)\.?\s+(.+)$", design_text(), re.M))
    subjects = {
        ".importlinter": "pipeline",
        "agent/core/severity.py": "severity",
        "agent/engine/verdict.py": "severity",
        "agent/core/node_keys.py": "node contract",
        "agent/reporters/brake.py": "brake",
        "agent/core/repair_budget.py": "repair budget",
        "agent/core/device_scope.py": "per-gpu",
        "manifests/40-hostengine.yaml": "deployment",
    }
    for rel, subject in subjects.items():
        points = pointers((ROOT / rel).read_text(encoding="utf-8"))
        assert points, rel
        title = titles.get(points[0], "(no such section)")
        assert subject in title.lower(), f"{rel} points to §{points[0]} {title!r}"


def issue_numbers(source: str) -> list[str]:
    """The comments and strings (docstrings included) of Python source that name an issue by number."""
    hits = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.STRING):
            hits += [f"{tok.start[0]}: {m}" for m in ISSUE.findall(tok.string)]
    return hits


def test_no_issue_numbers_in_code_comments() -> None:
    found = []
    for top in CODE_DIRS:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT)
            found += [f"{rel}:{hit}" for hit in issue_numbers(path.read_text(encoding="utf-8"))]
    assert not found, "say what it means, not which issue asked:\n" + "\n".join(found)


def test_an_issue_number_in_a_comment_is_found() -> None:
    number = "2" + "8"
    source = (
        f'"""Why (issue {number} item 4)."""\n'
        f"X = 1  # ---- end Issue #{number}\n"
        'Y = "issue-sglang-30401"  # a fixture\'s name is no issue number\n'
    )
    assert issue_numbers(source) == [f"1: issue {number}", f"2: Issue #{number}"]
