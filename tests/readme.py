"""The user docs as tests read them: the YAML blocks of the pages that say how to configure what acts
on the marks, so a test configures what the docs document (one source), and the docs' whole text,
for a test that asks only whether a fact is documented (issue 46 moved the README's sections into
docs/; the README keeps the two commands, install and where to go)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from agent.config import yaml_safe

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
# "From mark to repair" as the README had it, in its order: the pages that hold its sections now
REMEDIATION = (
    "clusters/device-plugin.md",
    "clusters/dra-only.md",
    "clusters/node-repair.md",
    "guides/validate-before-service.md",
    "guides/un-quarantine.md",
)


def page(name: str) -> str:
    """The text of docs/*name* (e.g. "guides/alerts.md")."""
    return (DOCS / name).read_text(encoding="utf-8")


def user_docs() -> str:
    """The README and every hand-written page of docs/ (not the generated reference), one text."""
    pages = sorted(p for p in DOCS.rglob("*.md") if "reference" not in p.relative_to(DOCS).parts)
    return "\n".join(p.read_text(encoding="utf-8") for p in (README, *pages))


def section(text: str, title: str) -> str:
    """The section of *text* headed *title* (a heading's start), to the next heading of its level or
    above (code blocks skipped)."""
    start = re.search(rf"^(#+) {re.escape(title)}", text, re.M)
    assert start is not None, title
    level, fenced = len(start.group(1)), False
    lines = text[start.start() :].split("\n")
    for n, line in enumerate(lines[1:], 1):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"(#+) ", line)) and len(m.group(1)) <= level:
            return "\n".join(lines[:n])
    return "\n".join(lines)


def section_docs(pages: tuple[str, ...] = REMEDIATION) -> list[dict[str, Any]]:
    """Every YAML document (a mapping) in the ```yaml blocks of *pages*, in order."""
    blocks = [b for name in pages for b in re.findall(r"```yaml\n(.*?)```", page(name), re.S)]
    return [d for b in blocks for d in yaml_safe.load_all(b) if isinstance(d, dict)]
