"""The three GPU readers give the same model for the same machine.

For every real recording that has both `nvidia-smi -q` and `nvidia-smi -q -x`, the text reader, the
XML reader and the NVML reader (the real pynvml over the fake libnvidia-ml.so.1 of tests/fakes/nvml,
its machine written from the `-q` recording) give the same GpuInventory, compared row by row of the
field table (agent/probes/gpu_fields.py). Each place a field differs is stated below with why, and
a stated difference that no longer holds fails too. Blanking one reader's column of a row makes this
comparison fail: the readers fill the model from the table and nothing else.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent.core.gpu import Gpu, GpuInventory
from agent.probes import gpu_fields
from agent.probes.gpu_fields import FIELDS, IDENTITY
from agent.probes.nvml import read_nvml
from agent.probes.nvml_session import SESSION
from agent.probes.nvsmi_text import parse_nvsmi_text
from agent.probes.nvsmi_xml import parse_nvsmi_xml
from tests.fakes.nvml.fake_nvml import from_recordings

FIX = Path(__file__).parent / "fixtures"
# Every real recording with both views: (-q text, -q -x XML) of the same machine.
PAIRS = {
    "h100-capture-580": (
        FIX / "nvidia-smi-q" / "h100-capture-580.159.04-q.txt",
        FIX / "nvidia-smi-xml" / "h100-capture-580.159.04-qx.xml",
    ),
    "h100-vm-snapshot": (
        FIX / "h100-vm-capture" / "nvidia-smi-q.txt",
        FIX / "h100-vm-capture" / "nvidia-smi-q.xml",
    ),
}
# The real -q -x recordings that have no -q twin, and why.
XML_ONLY = {
    name: "telegraf's test data (its nvidia_smi plugin) holds only the -q -x output"
    for name in (
        "telegraf-a100-sxm4-80gb-mig-535.54.03.xml",
        "telegraf-a10g-515.105.01.xml",
        "telegraf-dual-rtx-a5000-590.44.01-v13.xml",
        "telegraf-rtx-4000-sff-ada-595.84-v13.xml",
        "telegraf-tesla-t4-515.105.01.xml",
    )
}
# (recording, reader, field) → why that reader's value differs from the -q text's.
EXCEPTIONS = {
    ("h100-capture-580", "xml", "thermal.memory_c"): (
        "-q and -q -x were two commands run one after the other: the HBM read 35 °C, then 34 °C"
    ),
    ("h100-capture-580", "xml", "power.draw_w"): (
        "-q and -q -x were two commands run one after the other: the board drew 70.42 W, then 70.36 W"
    ),
    ("h100-vm-snapshot", "xml", "power.draw_w"): (
        "the snapshot ran -q, then -q -x: a 1 s average of 71.75 W, then 71.78 W"
    ),
}
# The rows NVML is not asked for (the model keeps None), and why.
NVML_NOT_ASKED = {
    "ecc.sram_threshold_exceeded": "the NVML reader never asked for it; -q and -q -x print it",
    "thermal.gpu_tlimit_margin_c": "the NVML reader never asked for T.Limit temperatures",
    "thermal.gpu_slowdown_tlimit_c": "the NVML reader never asked for T.Limit temperatures",
}
# Rows no pair exercises (None in every reader on both H100s): their readers are held to the table
# by the per-reader tests on other recordings only.
NOT_IN_ANY_PAIR = {
    **dict.fromkeys(
        ("retired_pages.single_bit", "retired_pages.double_bit", "retired_pages.pending"),
        "an H100 remaps rows: no page retirement",
    ),
    **dict.fromkeys(
        ("ecc.volatile_double_bit_total", "ecc.aggregate_double_bit_total", "ecc.volatile_single_bit_total"),
        "the pre-Ampere ECC layout",
    ),
    **dict.fromkeys(
        ("reset_required", "drain_and_reset_recommended"),
        "R580 prints the recovery action instead of the older reset status",
    ),
    **dict.fromkeys(("fabric.state", "fabric.status"), "a single GPU in a VM: no NVSwitch fabric"),
    "thermal.gpu_slowdown_c": "Hopper states its slowdown relative to T.Limit",
    "thermal.memory_max_c": "N/A on this H100",
}


def value(gpu: Gpu, path: str) -> Any:
    """A row's value in a model, None where a part on the way is None (retired_pages: N/A)."""
    node: Any = gpu
    for part in path.split("."):
        node = getattr(node, part) if node is not None else None
    return node


def differences(reference: GpuInventory, other: GpuInventory, name: str, reader: str) -> dict[str, Any]:
    """(row or inventory field) → (reference's, other's), less the stated exceptions."""
    diff: dict[str, Any] = {}
    for key in ("driver_version", "cuda_version", "attached_gpus", "lost"):
        if getattr(reference, key) != getattr(other, key):
            diff[key] = (getattr(reference, key), getattr(other, key))
    if [(g.index, g.pci_bus_id) for g in reference.gpus] != [(g.index, g.pci_bus_id) for g in other.gpus]:
        diff["gpus"] = ([g.pci_bus_id for g in reference.gpus], [g.pci_bus_id for g in other.gpus])
        return diff
    for ref, got in zip(reference.gpus, other.gpus, strict=True):
        for row in FIELDS:
            if reader == "nvml" and row.name in NVML_NOT_ASKED:
                continue
            a, b = value(ref, row.name), value(got, row.name)
            # a stated exception is two reads of a moving value: never one read missing
            moved = (name, reader, row.name) in EXCEPTIONS and a is not None and b is not None
            if a != b and not moved:
                diff[f"GPU {ref.index} {row.name}"] = (a, b)
    return diff


def read_all(name: str, fake_nvml: Any | None) -> dict[str, GpuInventory]:
    """The readers on one recording (NVML where `fake_nvml` is given): NVML's machine is the -q
    recording's, with its CUDA version (which the fake's machine does not derive)."""
    text_file, xml_file = PAIRS[name]
    text = parse_nvsmi_text(text_file.read_text(encoding="utf-8"))
    models = {"text": text, "xml": parse_nvsmi_xml(xml_file.read_text(encoding="utf-8"))}
    if fake_nvml is not None:
        machine = from_recordings(text_file)
        major, _, minor = (text.cuda_version or "0.0").partition(".")
        machine.cuda = int(major) * 1000 + int(minor) * 10
        SESSION.close()  # a fresh NVML session on the new machine
        fake_nvml.write(machine, now=True)
        models["nvml"] = read_nvml(timeout_s=10)
    return models


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_text_xml_and_nvml_give_the_same_model(name: str, fake_nvml: Any) -> None:
    models = read_all(name, fake_nvml)
    assert models["nvml"].source == "nvml" and len(models["text"].gpus) >= 1
    for reader in ("xml", "nvml"):
        assert differences(models["text"], models[reader], name, reader) == {}, reader
    # The same evidence keys from both views (the rows' `evidence`), each with its lines.
    for t, x in zip(models["text"].gpus, models["xml"].gpus, strict=True):
        assert set(t.where) == set(x.where) and all(t.where.values())
    # Every stated exception still holds: the values differ there.
    for (pair, reader, row), why in EXCEPTIONS.items():
        if pair == name:
            got = [
                (value(a, row), value(b, row))
                for a, b in zip(models["text"].gpus, models[reader].gpus, strict=True)
            ]
            assert any(a != b for a, b in got), f"{row} no longer differs ({why})"


def test_every_field_of_the_model_has_its_row_and_every_gap_is_stated(fake_nvml: Any) -> None:
    def leaves(cls: type, prefix: str = "") -> set[str]:
        out: set[str] = set()
        for name, (part, _) in gpu_fields.parts_of(cls).items():
            out |= leaves(part, f"{prefix}{name}.") if part is not None else {prefix + name}
        return out

    rows = {f.name for f in FIELDS}
    assert len(rows) == len(FIELDS)
    assert leaves(Gpu) == rows | set(IDENTITY)
    assert all(f.text and f.xml for f in FIELDS)  # both views print every field
    assert {f.name for f in FIELDS if f.nvml is None} == set(NVML_NOT_ASKED)
    unexercised = set(rows)
    for name in PAIRS:
        for inv in read_all(name, fake_nvml).values():
            unexercised -= {r for g in inv.gpus for r in rows if value(g, r) is not None}
    assert unexercised == set(NOT_IN_ANY_PAIR)


def test_every_real_xml_recording_is_paired_or_stated() -> None:
    xml = {p for p in FIX.rglob("*.xml") if "DERIVED" not in p.name and "crds" not in p.parts}
    assert xml == {x for _, x in PAIRS.values()} | {FIX / "nvidia-smi-xml" / n for n in XML_ONLY}


EXERCISED = sorted({f.name for f in FIELDS} - set(NOT_IN_ANY_PAIR))
BLANKED = [
    (row, reader)
    for row in EXERCISED
    for reader in ("text", "xml", "nvml")
    if not (reader == "nvml" and row in NVML_NOT_ASKED)  # stated above: nothing to blank
]


@pytest.mark.parametrize(("row", "reader"), BLANKED)
def test_a_row_missing_from_one_reader_fails_the_comparison(
    row: str, reader: str, fake_nvml: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader's column of the row is blanked: the comparison names that row. (Text is compared
    with XML here: the fake NVML's machine is written from the text reader's model.)"""
    blank: dict[str, dict[str, Any]] = {
        "text": {"text": (), "fallback_text": ()},
        "xml": {"xml": (), "fallback_xml": ()},
        "nvml": {"nvml": lambda d: None},
    }
    changed = tuple(replace(f, **blank[reader]) if f.name == row else f for f in FIELDS)
    found = []
    for name in PAIRS:
        machine = fake_nvml if reader == "nvml" else None
        with monkeypatch.context() as patch:
            patch.setattr(gpu_fields, "FIELDS", changed)
            models = read_all(name, machine)
        reference = "xml" if reader == "text" else "text"
        found += [k for k in differences(models[reference], models[reader], name, reader) if k.endswith(row)]
    assert found
