"""The documents' examples number the GPUs as the bundled snapshot does: a paragraph that names a PCI
address of the p5.48xlarge recording (examples/snapshots) and a "GPU N" gives N the GPU's minor
number there (0000:97:00.0 is GPU 4, DRA device gpu-4), so that a reader who maps the demo's Xid to
a GPU or a DRA device gets the right one."""

from __future__ import annotations

import re
from pathlib import Path

from agent.core.pci import short_pci

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT = ROOT / "examples" / "snapshots" / "p5.48xlarge-healthy" / "nvidia-smi-q.txt"
DOCS = (
    "README.md",
    "DESIGN.md",
    "CHANGELOG.md",
    "examples/snapshots/SOURCE.md",
    *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md")),
)
ADDRESS = re.compile(r"\b(?:[0-9a-fA-F]{4}){1,2}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]\b")
GPU = re.compile(r"\b(?:GPU |gpu-)(\d+)\b(?!:)")  # not "GPU 00000000:97:00.0"


def minors() -> dict[str, int]:
    """PCI address (short form) → minor number, from the recording's `nvidia-smi -q`."""
    text = SNAPSHOT.read_text()
    found = re.findall(r"^GPU ([0-9A-Fa-f:.]+)\n(?:.*\n)*?\s+Minor Number\s+: (\d+)", text, re.M)
    return {short_pci(pci): int(minor) for pci, minor in found}


def mismatches(text: str, known: dict[str, int]) -> list[str]:
    """The paragraphs that name a recording's address and a GPU number that is none of theirs."""
    out = []
    for para in re.split(r"\n\s*\n", text):
        addresses = {short_pci(a) for a in ADDRESS.findall(para)} & set(known)
        if not addresses:
            continue
        numbers = {int(n) for n in GPU.findall(para)}
        if numbers - {known[a] for a in addresses}:
            out.append(f"{sorted(addresses)} with GPU {sorted(numbers)}: {para.strip()[:160]}")
    return out


def test_the_snapshot_numbers_its_gpus_by_minor() -> None:
    known = minors()
    assert len(known) == 8
    assert (known["0000:86:00.0"], known["0000:97:00.0"]) == (3, 4)


def test_every_example_pairs_an_address_with_its_gpu_number() -> None:
    known = minors()
    bad = {doc: mismatches((ROOT / doc).read_text(), known) for doc in DOCS}
    assert not {doc: b for doc, b in bad.items() if b}, bad


def test_a_wrong_pair_is_found() -> None:
    """The clear example as it was: the demo's Xid on 0000:97:00.0 and "GPU 3 reseated"."""
    wrong = 'gpu-healthcheck clear NODE --latch xid/79/0000:97:00.0 --reason "GPU 3 reseated"\n'
    assert mismatches(wrong, minors())
    assert not mismatches(wrong.replace("GPU 3", "GPU 4"), minors())
    assert not mismatches("GPU 3 (00000000:86:00.0) and gpu-3", minors())
