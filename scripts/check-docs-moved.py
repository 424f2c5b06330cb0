#!/usr/bin/env python3
"""No fact lost: every sentence, list item, table row and code line of the README of a git revision
(default 8cd2c0d, the 3,064-line README before issue 46 moved it into docs/) is found, after
normalising, in docs/**/*.md, DESIGN.md or today's README.md.

Normalising: Markdown links become their text, emphasis, backticks, quotes and heading marks go, and
runs of white space are one space; a moved section may link a name it quoted, or sit a heading level
higher, and still match ("README" before a quoted section name, now a link, is dropped). A unit not
found is printed with its line in that README; exit 1 if any. `--allow FILE` takes the units that
were reworded on purpose and checked by hand (lines as this script prints them; other lines are
comments).

    python scripts/check-docs-moved.py [--rev REV] [--allow scripts/check-docs-moved.allow] [-v]

After a merge that edited the old README: `--rev` the merged README's commit lists what to carry
into docs/.

Run by hand, not by the suite: it checked the move of issue 46 (1,731 units of 8cd2c0d's README, 0
missing but the 7 in the allow file). Later edits of a moved sentence are the docs changing, not a
fact lost, so a test pinned to 8cd2c0d would fail every such edit.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def norm(text: str) -> str:
    text = text.replace("README [", "[").replace('README "', '"')  # README "X" moved: a link to X
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # [text](url) → text
    text = re.sub(r"^\s*#{1,6}\s+", "", text, flags=re.M)  # heading marks
    text = re.sub(r"^\s*(?:[-*+]|\d+\.)\s+", "", text, flags=re.M)  # list marks
    text = re.sub(r"\*\*|__|`|\"|“|”", "", text)
    text = text.replace("|", " | ")
    return re.sub(r"\s+", " ", text).strip()


SENTENCE_END = re.compile(r"(?<=[.!?:;])\s+(?=[A-Z(`*\"])")


def units(text: str) -> list[tuple[int, str]]:
    """(line, unit) for every code line, table row, list item and sentence of *text*."""
    out: list[tuple[int, str]] = []
    lines = text.split("\n")
    fenced, para, start = False, [], 0

    def flush() -> None:
        if para:
            joined = " ".join(para)
            for piece in SENTENCE_END.split(joined):
                if len(norm(piece)) > 3:
                    out.append((start + 1, piece))
            para.clear()

    for n, line in enumerate(lines):
        if line.startswith("```"):
            flush()
            fenced = not fenced
            continue
        if fenced:
            if line.strip():
                out.append((n + 1, line))
            continue
        if line.startswith("|"):
            flush()
            if not re.fullmatch(r"[|\s:-]+", line):
                out.append((n + 1, line))
            continue
        if not line.strip() or re.match(r"#{1,6} ", line) or re.match(r"\s*(?:[-*+]|\d+\.)\s", line):
            flush()
            if re.match(r"#{1,6} ", line):
                out.append((n + 1, line))
                continue
            if not line.strip():
                continue
        if not para:
            start = n
        para.append(line.strip())
    flush()
    return out


def corpus() -> str:
    files = [ROOT / "README.md", ROOT / "DESIGN.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return "\n".join(norm(f.read_text(encoding="utf-8")) for f in files)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", default="8cd2c0d")
    ap.add_argument("--allow", type=Path)
    ap.add_argument("-v", action="store_true", help="print the count of units checked")
    args = ap.parse_args(argv)
    old = subprocess.run(
        ["git", "show", f"{args.rev}:README.md"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    allowed = set()
    if args.allow:
        lines = args.allow.read_text(encoding="utf-8").splitlines()
        allowed = {norm(x.split(": ", 1)[1]) for x in lines if x.startswith("README.md@")}
    have = corpus()
    checked = [(n, u) for n, u in units(old)]
    missing = [(n, u) for n, u in checked if norm(u) not in have and norm(u) not in allowed]
    for n, u in missing:
        print(f"README.md@{args.rev}:{n}: {u.strip()}")
    if args.v or missing:
        print(f"{len(checked)} units checked, {len(missing)} not found", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
