"""The YAML blocks of a README.md section, so a test configures what the README documents (one source)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from agent.config import yaml_safe

README = Path(__file__).resolve().parent.parent / "README.md"
REMEDIATION = "## From mark to repair"


def section_docs(title: str = REMEDIATION, readme: Path = README) -> list[dict[str, Any]]:
    """Every YAML document (a mapping) in the ```yaml blocks of the section headed *title*, in order."""
    text = readme.read_text()
    section = text[text.index(title) :]
    end = section.find("\n## ", len(title))
    blocks = re.findall(r"```yaml\n(.*?)```", section if end < 0 else section[:end], re.S)
    return [d for b in blocks for d in yaml_safe.load_all(b) if isinstance(d, dict)]
