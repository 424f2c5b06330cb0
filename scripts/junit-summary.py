"""One Markdown table row from a pytest JUnit XML: version, passed, failed, skipped and why
(scripts/test-compat.sh)."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter


def row(version: str, path: str) -> str:
    cases = ET.parse(path).getroot().iter("testcase")
    passed = failed = 0
    skipped: Counter[str] = Counter()
    for case in cases:
        skip = case.find("skipped")
        if skip is not None:
            skipped[(skip.get("message") or "").strip()] += 1
        elif case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        else:
            passed += 1
    why = "; ".join(f"{n}: {msg}" for msg, n in skipped.most_common()) or "none"
    return f"| {version} | {passed} | {failed} | {sum(skipped.values())} | {why} |"


if __name__ == "__main__":
    print(row(sys.argv[1], sys.argv[2]))
