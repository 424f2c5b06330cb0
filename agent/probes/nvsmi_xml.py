"""Parse `nvidia-smi -q -x` (DTD v11, v12, v13) into the GPU model.

The stdlib parser never fetches the DOCTYPE's external DTD; documents that declare their own
entities are refused outright (no entity-expansion games from a file we did not write)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import replace

from agent.core.gpu import (
    ClockEvents,
    EccErrors,
    Gpu,
    GpuClocks,
    GpuInventory,
    GpuThermal,
    LostGpu,
    PcieLink,
    RemappedRows,
    RetiredPages,
)
from agent.core.pci import normalize_pci
from agent.core.probed import ParseError, SourceLine
from agent.probes.nvsmi_errors import (
    ToolReportedFailure,
    detect_lost_gpus,
    detect_no_devices,
    detect_tool_failure,
    other_text,
)
from agent.probes.nvsmi_power import xml_power
from agent.probes.nvsmi_values import (
    WHERE_XML,
    add_optional,
    any_true,
    as_bool,
    as_int,
    assign_indices,
    clean,
    fabric_or_none,
    histogram_or_none,
    remapped_rows_or_none,
    retired_pages_or_none,
)

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


def _where(text: str, begin: int, end: int) -> dict[str, tuple[SourceLine, ...]]:
    """The lines of text[begin:end] (one <gpu> element) that hold each judged value."""
    where: dict[str, tuple[SourceLine, ...]] = {}
    for key, paths in WHERE_XML.items():
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
    pci_raw = clean(el.get("id")) or _text(el, "pci/pci_bus_id")
    if pci_raw is None:
        raise ParseError(
            f"<gpu> element number {index} has no PCI bus id (no id attribute, no pci/pci_bus_id)"
        )
    return Gpu(
        index=index,
        pci_bus_id=normalize_pci(pci_raw),
        name=_text(el, "product_name"),
        uuid=_text(el, "uuid"),
        serial=_text(el, "serial"),
        architecture=_text(el, "product_architecture"),
        persistence_mode=as_bool(_text(el, "persistence_mode")),
        mig_mode=as_bool(_text(el, "mig_mode/current_mig")),
        ecc=_ecc(el),
        retired_pages=_retired_pages(el.find("retired_pages")),
        remapped_rows=_remapped_rows(el.find("remapped_rows")),
        clock_events=_clock_events(el),
        pcie=_pcie(el.find("pci")),
        recovery_action=_text(el, "gpu_recovery_action"),
        reset_required=as_bool(_text(el, "gpu_reset_status/reset_required")),
        drain_and_reset_recommended=as_bool(_text(el, "gpu_reset_status/drain_and_reset_recommended")),
        fabric=fabric_or_none(_text(el, "fabric/state"), _text(el, "fabric/status")),
        power=xml_power(el),
        thermal=_thermal(el.find("temperature")),
        clocks=_clocks(el),
    )


def _sram_uncorrectable(scope: ET.Element | None) -> int | None:
    """R550+ splits SRAM uncorrectable into parity and SEC-DED; older drivers print one value."""
    single = as_int(_text(scope, "sram_uncorrectable"))
    if single is not None:
        return single
    return add_optional(
        as_int(_text(scope, "sram_uncorrectable_parity")), as_int(_text(scope, "sram_uncorrectable_secded"))
    )


def _ecc(el: ET.Element) -> EccErrors:
    errors = el.find("ecc_errors")
    vol = errors.find("volatile") if errors is not None else None
    agg = errors.find("aggregate") if errors is not None else None
    return EccErrors(
        mode_enabled=as_bool(_text(el, "ecc_mode/current_ecc")),
        volatile_dram_uncorrectable=as_int(_text(vol, "dram_uncorrectable")),
        volatile_sram_uncorrectable=_sram_uncorrectable(vol),
        aggregate_dram_uncorrectable=as_int(_text(agg, "dram_uncorrectable")),
        aggregate_sram_uncorrectable=_sram_uncorrectable(agg),
        volatile_dram_correctable=as_int(_text(vol, "dram_correctable")),
        aggregate_dram_correctable=as_int(_text(agg, "dram_correctable")),
        volatile_sram_correctable=as_int(_text(vol, "sram_correctable")),
        aggregate_sram_correctable=as_int(_text(agg, "sram_correctable")),
        sram_threshold_exceeded=as_bool(_text(agg, "sram_threshold_exceeded")),
        volatile_double_bit_total=as_int(_text(vol, "double_bit/total")),
        aggregate_double_bit_total=as_int(_text(agg, "double_bit/total")),
        volatile_single_bit_total=as_int(_text(vol, "single_bit/total")),
    )


def _retired_pages(el: ET.Element | None) -> RetiredPages | None:
    if el is None:
        return None
    return retired_pages_or_none(
        as_int(_text(el, "multiple_single_bit_retirement/retired_count")),
        as_int(_text(el, "double_bit_retirement/retired_count")),
        any_true(as_bool(_text(el, "pending_blacklist")), as_bool(_text(el, "pending_retirement"))),
    )


def _remapped_rows(el: ET.Element | None) -> RemappedRows | None:
    if el is None or len(el) == 0:  # absent, or the literal text "N/A" (pre-Ampere, MIG)
        return None

    def bucket(name: str) -> int | None:
        return as_int(_text(el, f"row_remapper_histogram/row_remapper_histogram_{name}"))

    return remapped_rows_or_none(
        as_int(_text(el, "remapped_row_corr")),
        as_int(_text(el, "remapped_row_unc")),
        as_bool(_text(el, "remapped_row_pending")),
        as_bool(_text(el, "remapped_row_failure")),
        histogram_or_none(bucket("max"), bucket("high"), bucket("partial"), bucket("low"), bucket("none")),
    )


def _clock_events(el: ET.Element) -> ClockEvents:
    section = el.find("clocks_event_reasons")
    prefix = "clocks_event_reason_"
    if section is None:
        section = el.find("clocks_throttle_reasons")
        prefix = "clocks_throttle_reason_"
    if section is None:
        return ClockEvents()

    def reason(name: str) -> bool | None:
        return as_bool(_text(section, prefix + name))

    return ClockEvents(
        hw_slowdown=reason("hw_slowdown"),
        hw_thermal_slowdown=reason("hw_thermal_slowdown"),
        hw_power_brake=reason("hw_power_brake_slowdown"),
        sw_power_cap=reason("sw_power_cap"),
        sw_thermal_slowdown=reason("sw_thermal_slowdown"),
        idle=reason("gpu_idle"),
        applications_clocks_setting=reason("applications_clocks_setting"),
        sync_boost=reason("sync_boost"),
        display_clock_setting=reason("display_clocks_setting"),
    )


def _thermal(t: ET.Element | None) -> GpuThermal:
    """v12+ name the slowdown threshold gpu_temp_slow_threshold (absolute) or, on Hopper and later,
    gpu_temp_slow_tlimit_threshold (relative to T.Limit, beside gpu_temp_tlimit)."""
    if t is None:
        return GpuThermal()
    return GpuThermal(
        gpu_c=as_int(_text(t, "gpu_temp")),
        gpu_slowdown_c=as_int(_text(t, "gpu_temp_slow_threshold")),
        gpu_tlimit_margin_c=as_int(_text(t, "gpu_temp_tlimit")),
        gpu_slowdown_tlimit_c=as_int(_text(t, "gpu_temp_slow_tlimit_threshold")),
        memory_c=as_int(_text(t, "memory_temp")),
        memory_max_c=as_int(_text(t, "gpu_temp_max_mem_threshold")),
    )


def _clocks(el: ET.Element) -> GpuClocks:
    app = as_int(_text(el, "applications_clocks/graphics_clock"))
    if app is None:
        app = as_int(_text(el, "default_applications_clocks/graphics_clock"))
    return GpuClocks(
        sm_mhz=as_int(_text(el, "clocks/sm_clock")),
        applications_mhz=app,
        max_sm_mhz=as_int(_text(el, "max_clocks/sm_clock")),
        utilization_percent=as_int(_text(el, "utilization/gpu_util")),
    )


def _pcie(pci: ET.Element | None) -> PcieLink:
    if pci is None:
        return PcieLink()
    return PcieLink(
        gen_current=as_int(_text(pci, "pci_gpu_link_info/pcie_gen/current_link_gen")),
        gen_max=as_int(_text(pci, "pci_gpu_link_info/pcie_gen/max_link_gen")),
        width_current=as_int(_text(pci, "pci_gpu_link_info/link_widths/current_link_width")),
        width_max=as_int(_text(pci, "pci_gpu_link_info/link_widths/max_link_width")),
        replay_counter=as_int(_text(pci, "replay_counter")),
    )
