#!/usr/bin/env python3
"""Rename test files to what they test (tools/test_renames.tsv: old<TAB>new, one a line) with
`git mv`, and rewrite every reference to them in the tracked files: paths (tests/test_x.py),
module names (tests.test_x) and bare stems (test_x), matched as whole words, so that a stem that
is the prefix of another (test_write_refused, test_write_refused_agent) is never cut.

    python scripts/rename-tests.py            # apply
    python scripts/rename-tests.py --dry-run  # say what it would do; change nothing

Recordings (tests/fixtures/) are never edited, and neither are the map and this script. It refuses,
before changing anything, when an old file is missing or a new one already exists. The Python files
it changed get their imports re-sorted and are formatted (ruff: .venv/bin/ruff, else on PATH), since
a new name can sort or wrap differently. Run it from a clean tree and commit what it did; `make lint`
and `pytest --collect-only -q` afterwards.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAP = ROOT / "tools" / "test_renames.tsv"
NEVER = ("tests/fixtures/", "tools/test_renames.tsv", "scripts/rename-tests.py")


def read_map(path: Path = MAP) -> list[tuple[str, str]]:
    pairs = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != 2 or not all(f.startswith("tests/test_") and f.endswith(".py") for f in fields):
            sys.exit(f"{path.name}:{n}: want 'tests/test_old.py<TAB>tests/test_new.py', got {line!r}")
        pairs.append((fields[0], fields[1]))
    return pairs


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def main(argv: list[str]) -> int:
    dry = "--dry-run" in argv
    pairs = read_map()
    problems = [f"{old}: not there" for old, _ in pairs if not (ROOT / old).is_file()]
    problems += [f"{new}: already there" for _, new in pairs if (ROOT / new).exists()]
    if problems:
        print("rename-tests: nothing done:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    stems = {Path(old).stem: Path(new).stem for old, new in pairs}
    word = re.compile(r"\b(" + "|".join(sorted(map(re.escape, stems), key=len, reverse=True)) + r")\b")
    for old, new in pairs:
        print(f"git mv {old} {new}")
        if not dry:
            git("mv", old, new)
    python_changed = []
    for name in git("ls-files", "-z").split("\0"):
        if not name or name.startswith(NEVER):
            continue
        path = ROOT / name
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary, or a submodule
        changed, count = word.subn(lambda m: stems[m.group(1)], text)
        if count:
            print(f"{name}: {count} reference(s)")
            if not dry:
                path.write_text(changed, encoding="utf-8")
                if name.endswith(".py"):
                    python_changed.append(name)
    if python_changed:
        ruff = ROOT / ".venv" / "bin" / "ruff"
        cmd = str(ruff) if ruff.is_file() else shutil.which("ruff")
        if cmd is None:
            print("rename-tests: no ruff: sort the imports of " + " ".join(python_changed), file=sys.stderr)
            return 1
        subprocess.run([cmd, "check", "--fix", "--select", "I", "-q", *python_changed], cwd=ROOT, check=True)
        subprocess.run([cmd, "format", "-q", *python_changed], cwd=ROOT, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
