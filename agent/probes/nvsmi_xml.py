"""Parse `nvidia-smi -q -x` (DTD v11, v12, v13) into the GPU model; each <gpu> element's values are
read by their element paths in the field table (gpu_fields).

The stdlib parser never fetches the DOCTYPE's external DTD; documents that declare their own
entities are refused outright (no entity-expansion games from a file we did not write)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import replace

from agent.core.gpu import Gpu, GpuInventory, LostGpu
from agent.core.pci import normalize_pci
from agent.core.probed import ParseError, SourceLine
from agent.probes.gpu_fields import model_parts, read_view, where_paths
from agent.probes.nvsmi_errors import (
    ToolReportedFailure,
    detect_lost_gpus,
    detect_no_devices,
    detect_tool_failure,
    other_text,
)
from agent.probes.nvsmi_values import as_int, assign_indices, clean

SOURCE = "nvidia-smi -q -x"
_XML_START = re.compile(r"<\?xml|<!DOCTYPE|<nvidia_smi_log\b")
_END_TAG = "</nvidia_smi_log>"


def parse_nvsmi_xml(text: str) -> GpuInventory:
    """`nvidia-smi -q -x` output → GpuInventory.

    Raises ToolReportedFailure when nvidia-smi printed a driver failure instead of XML, and
    ParseError for anything else that is not one complete, consistent nvidia_smi_log document: no
    closing tag (cut short), not well-formed, fewer or more <gpu> elements (plus GPUs nvidia-smi says
    are lost, on the lines around the document) than <attached_gpus>, a GPU twice. The ParseError
    then carries, as `partial`, the <gpu> elements that are complete and well-formed.
    """
    failure = detect_tool_failure(text)
    if failure is not None:
        raise ToolReportedFailure(failure)
    start = _XML_START.search(text)
    if start is None:
        lost = detect_lost_gpus(text)
        stray = other_text(text)
        if stray is None and (lost or detect_no_devices(text)):
            # nvidia-smi printed its complaints and no XML: no GPU could be read.
            return GpuInventory(source=SOURCE, attached_gpus=0 if not lost else None, lost=tuple(lost))
        raise ParseError(
            "not nvidia-smi -q -x output: no XML document found",
            partial=GpuInventory(source=SOURCE, lost=tuple(lost)) if lost else None,
        )
    end = text.rfind(_END_TAG)
    if end < start.start():
        raise ParseError(
            "nvidia-smi -q -x output is cut short: no closing </nvidia_smi_log>",
            partial=_complete_gpus(
                text[start.start() :], detect_lost_gpus(text[: start.start()]), start.start(), text
            ),
        )
    end += len(_END_TAG)
    outside = text[: start.start()] + "\n" + text[end:]
    # Their line numbers would count in `outside`, or in another view that was appended: none kept.
    lost = [replace(lg, where=None) for lg in detect_lost_gpus(outside)]
    document = text[start.start() : end]
    if "<!ENTITY" in document:
        raise ParseError("nvidia-smi -q -x output declares XML entities; refusing to expand them")
    if _NOT_UTF8 in document:
        raise ParseError(
            "nvidia-smi -q -x output holds bytes that are not UTF-8",
            partial=_complete_gpus(document, lost, start.start(), text),
        )
    try:
        root = ET.fromstring(document)
    except (ET.ParseError, ValueError, UnicodeError) as exc:
        raise ParseError(
            f"nvidia-smi -q -x output is not well-formed XML: {exc}",
            partial=_complete_gpus(document, lost, start.start(), text),
        ) from None
    if root.tag != "nvidia_smi_log":
        raise ParseError(f"unexpected XML root <{root.tag}>, expected <nvidia_smi_log>")

    gpus = [_gpu(i, el) for i, el in enumerate(root.findall("gpu"))]
    spans = list(_GPU_ELEMENT.finditer(document))
    if len(spans) == len(gpus):
        gpus = [
            replace(g, where=_where(text, start.start() + m.start(), start.start() + m.end()))
            for g, m in zip(gpus, spans, strict=True)
        ]
    inventory = GpuInventory(
        source=SOURCE,
        driver_version=clean(root.findtext("driver_version")),
        cuda_version=clean(root.findtext("cuda_version")),
        attached_gpus=as_int(root.findtext("attached_gpus")),
        gpus=assign_indices(gpus, lost),
        lost=tuple(lost),
    )
    described = len(gpus) + len(lost)
    attached = inventory.attached_gpus
    pcis = [g.pci_bus_id for g in gpus]
    if len(set(pcis)) != len(pcis):
        raise ParseError("nvidia-smi -q -x output describes a GPU twice")
    if attached is not None and attached != described:
        # Fewer: an excerpt, or a GPU whose error went to stderr and was not kept with the XML (the
        # snapshot and the live probe add nvidia-smi's "GPU is lost" lines when it prints them).
        raise ParseError(
            f"<attached_gpus> says {attached} but the document describes {len(gpus)} GPU(s) and "
            f"{len(lost)} lost GPU(s)",
            partial=inventory,
        )
    return inventory


_GPU_ELEMENT = re.compile(r"<gpu\b[^>]*>.*?</gpu>", re.S)
# U+FFFD stands for bytes that were not UTF-8: legal XML text, but never nvidia-smi's.
_NOT_UTF8 = "\ufffd"
_WHERE = where_paths("xml")


def _where(text: str, begin: int, end: int) -> dict[str, tuple[SourceLine, ...]]:
    """The lines of text[begin:end] (one <gpu> element) that hold each judged value."""
    where: dict[str, tuple[SourceLine, ...]] = {}
    for key, paths in _WHERE.items():
        found: list[SourceLine] = []
        for path in paths:
            pos = begin
            for tag in path.split("/"):
                pos = text.find(f"<{tag}>", pos, end)
                if pos < 0:
                    break
            if pos >= 0:
                line_start = text.rfind("\n", 0, pos) + 1
                line_end = text.find("\n", pos)
                found.append(
                    SourceLine(
                        text.count("\n", 0, pos) + 1,
                        text[line_start : line_end if line_end >= 0 else len(text)].strip(),
                    )
                )
        if found:
            where[key] = tuple(found)
    return where


def _complete_gpus(
    document: str, lost: list[LostGpu], offset: int = 0, text: str = ""
) -> GpuInventory | None:
    """The <gpu> elements of a damaged document that are complete and well-formed on their own
    (`document` starts at `offset` of `text`, for the evidence's line numbers)."""
    gpus: list[Gpu] = []
    for match in _GPU_ELEMENT.finditer(document):
        if _NOT_UTF8 in match.group(0):
            continue
        try:
            gpu = _gpu(len(gpus), ET.fromstring(match.group(0)))
        except (ET.ParseError, ValueError, UnicodeError, ParseError):
            continue
        if text:
            gpu = replace(gpu, where=_where(text, offset + match.start(), offset + match.end()))
        gpus.append(gpu)
    if not gpus and not lost:
        return None
    return GpuInventory(source=SOURCE, gpus=assign_indices(gpus, lost), lost=tuple(lost))


def _text(el: ET.Element | None, path: str) -> str | None:
    """Text of a descendant, whitespace-collapsed, None when absent or N/A."""
    if el is None:
        return None
    found = el.find(path)
    if found is None:
        return None
    return clean(found.text) if len(found) == 0 else None


def _gpu(index: int, el: ET.Element) -> Gpu:
    """One <gpu> element, every field read by its row of the field table."""
    pci_raw = clean(el.get("id")) or _text(el, "pci/pci_bus_id")
    if pci_raw is None:
        raise ParseError(
            f"<gpu> element number {index} has no PCI bus id (no id attribute, no pci/pci_bus_id)"
        )
    values = read_view(lambda path: _text(el, path), "xml")
    return Gpu(index=index, pci_bus_id=normalize_pci(pci_raw), **model_parts(values))
