"""Parse plain `nvidia-smi -q` (and `-q -d SECTION` views) into the GPU model.

The output is an indentation tree. Every value is looked up by its full section path, never by a
bare key: "Pending" is a pending MIG mode under "MIG Mode", a pending ECC mode under "ECC Mode",
and a fault (row remap pending, needs a reset) under "Remapped Rows"."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from agent.core.gpu import (
    ClockEvents,
    EccErrors,
    Gpu,
    GpuClocks,
    GpuInventory,
    GpuThermal,
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
    is_lost_gpu_line,
    other_text,
)
from agent.probes.nvsmi_power import text_power
from agent.probes.nvsmi_values import (
    WHERE_TEXT,
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

SOURCE = "nvidia-smi -q"
_BANNER = re.compile(r"^=+\s*NVSMI LOG\s*=+$")
_GPU_HEADER = re.compile(r"^gpu\s+(?P<pci>[0-9a-f]{1,8}:[0-9a-f]{1,2}:[0-9a-f]{1,2}\.[0-9a-f])$", re.I)
# "Key<spaces>: value". The colon must follow whitespace, so bus ids in values and headers stay whole.
_KEY_VALUE = re.compile(r"^(?P<key>\S.*?)\s+:(?:\s+(?P<value>.*))?$")
# Control characters other than tab, and U+FFFD (bytes that were not UTF-8): never in nvidia-smi's
# output, so a line holding one was damaged ("Comp\x00leted" must not read as a fabric state).
_GARBLED = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd]")


@dataclass
class _Node:
    key: str  # normalised: lower case, single spaces
    value: str | None  # raw text after the colon; None for a section header
    indent: int
    line: int
    children: list[_Node] = field(default_factory=list)
    garbled: bool = False  # the line holds bytes nvidia-smi never prints (NUL, not UTF-8)
    after_blank: bool = False  # a blank line came just before it

    def child(self, *path: str) -> _Node | None:
        """First node along a path of keys (case-insensitive), or None."""
        node: _Node | None = self
        for key in path:
            if node is None:
                return None
            want = _norm(key)
            node = next((c for c in node.children if c.key == want), None)
        return node

    def get(self, *path: str) -> str | None:
        node = self.child(*path)
        return node.value if node is not None else None

    def find(self, key: str) -> _Node | None:
        """First descendant with this key at any depth: clock reasons nest "HW Thermal Slowdown"
        under "HW Slowdown"."""
        want = _norm(key)
        stack = list(reversed(self.children))
        while stack:
            node = stack.pop()
            if node.key == want:
                return node
            stack.extend(reversed(node.children))
        return None


def _norm(key: str) -> str:
    return " ".join(key.split()).lower()


def _tree(lines: list[str]) -> tuple[_Node, bool]:
    """Indentation tree of the output, without banner and lost-GPU lines; and whether the banner
    was seen."""
    root = _Node(key="", value=None, indent=-1, line=0)
    stack = [root]
    banner = False
    blank = False
    for number, raw in enumerate(lines, start=1):
        line = raw.expandtabs(4).rstrip()
        stripped = line.strip()
        if not stripped:
            blank = True
            continue
        if _BANNER.match(stripped):
            banner = True
            continue
        if is_lost_gpu_line(stripped):
            continue
        indent = len(line) - len(line.lstrip(" "))
        match = _KEY_VALUE.match(stripped)
        if match:
            node = _Node(_norm(match.group("key")), match.group("value") or "", indent, number)
        else:
            node = _Node(_norm(stripped), None, indent, number)
        node.garbled = _GARBLED.search(stripped) is not None
        node.after_blank, blank = blank, False
        while stack[-1].indent >= indent:
            stack.pop()
        stack[-1].children.append(node)
        stack.append(node)
    return root, banner


# Sections whose values the checks judge, and the keys nvidia-smi prints in each (R470-R595). A key
# of one of them found under another means lines were lost or moved: "Pending : Yes" of Remapped
# Rows read as a retired-pages flag would be a fault the GPU does not have.
_JUDGED_KEYS = {
    "retired pages": {
        "single bit ecc",
        "double bit ecc",
        "pending page blacklist",
        "pending page retirement",
    },
    "remapped rows": {
        "correctable error",
        "uncorrectable error",
        "remapping failure occurred",
        "bank remap availability histogram",
    },
    "gpu reset status": {"reset required", "drain and reset recommended"},
}
# Yes/No flags that raise a fault: any other value (a cut "Ye", "Enabled" moved from ECC Mode) is a
# damaged block, never read as a fault.
_FLAGS = {
    ("remapped rows", "pending"),
    ("remapped rows", "remapping failure occurred"),
    ("retired pages", "pending page blacklist"),
    ("retired pages", "pending page retirement"),
    ("retired pages", "pending"),
    ("aggregate", "sram threshold exceeded"),
    ("gpu reset status", "reset required"),
    ("gpu reset status", "drain and reset recommended"),
}
_YES_NO = {"yes", "no"}
# The top-level keys of a GPU block the parser reads (checked for repeats and flags).
_READ_SECTIONS = {path[0].lower() for paths in WHERE_TEXT.values() for path in paths} | {
    "clocks event reasons",
    "clocks throttle reasons",
    "mig mode",
    "ecc mode",
    "product architecture",
    "gpu uuid",
    "serial number",
}


def _block_damage(block: _Node) -> str | None:
    """Why a GPU block cannot be trusted as evidence (lines lost, moved or repeated), or None.

    nvidia-smi never prints a blank line or a NUL inside a block, never a key twice in a section
    that is read (other sections may repeat theirs: one "MIG Device" per MIG instance, processes)
    and never a flag as anything but Yes/No/N/A: a block that does was damaged after it was written."""
    if block.garbled:
        return f"line {block.line} holds bytes nvidia-smi never prints"
    everything = list(block.children)
    while everything:
        node = everything.pop()
        everything.extend(node.children)
        if node.garbled:
            return f"line {node.line} holds bytes nvidia-smi never prints (NUL, not UTF-8)"
        if node.after_blank:
            # nvidia-smi separates GPU blocks by a blank line, never sections: lines were lost
            # here, maybe the next GPU's header, whose lines would then read as this GPU's.
            return f"line {node.line} follows a blank line inside the block"
    stack = [block]
    while stack:
        node = stack.pop()
        seen: dict[str, int] = {}
        for child in node.children:
            if node is block and child.key not in _READ_SECTIONS:
                continue
            if child.key in seen:
                return f"line {child.line}: {child.key!r} appears twice under {node.key!r}"
            seen[child.key] = child.line
            if (node.key, child.key) in _FLAGS and child.value is not None:
                value = clean(child.value)
                if value is not None and value.lower() not in _YES_NO:
                    return f"line {child.line}: {child.key!r} reads {value[:40]!r}, not Yes/No"
            foreign = [
                other for other, keys in _JUDGED_KEYS.items() if other != node.key and child.key in keys
            ]
            if node.key in _JUDGED_KEYS and foreign:
                return f"line {child.line}: {child.key!r} (of {foreign[0]!r}) found under {node.key!r}"
            stack.append(child)
    return None


# Keys whose values the parser reads, anywhere in a block (a superset is only stricter): the value of
# such a key on a last line without its newline must be whole by its grammar to be read.
_READ_KEYS = {
    _norm(k)
    for k in (
        *(key for paths in WHERE_TEXT.values() for path in paths for key in path),
        *(key for keys in _JUDGED_KEYS.values() for key in keys),
        *(key for _, key in _FLAGS),
        *("Current", "Max", "Pending", "Total", "Replays Since Reset", "Performance State"),
        *("HW Slowdown", "HW Thermal Slowdown", "HW Power Brake Slowdown", "SW Power Cap"),
        *("SW Thermal Slowdown", "DRAM Correctable", "Current Power Limit", "Enforced Power Limit"),
        *("Default Power Limit", "GPU UUID", "Serial Number", "Product Architecture", "Attached GPUs"),
        *("Driver Version", "CUDA Version"),
    )
}
# Values that are no prefix of another value of their key (checked case-insensitively); "No" is
# whole only for a Yes/No flag ("No" of "None", "Not Active").
_WHOLE_WORDS = {
    "yes",
    "n/a",
    "none",
    "enabled",
    "disabled",
    "active",
    "not active",
    "completed",
    "success",
    "in progress",
    "not started",
    "not supported",
    "unknown error",
    "0",
}
# A value that ends with its unit or a closing bracket is whole: "16x", "700.00 W", "0 bank(s)".
_WITH_UNIT = re.compile(r"(?:\d\s*(?:x|%|W|C|V|mV|MHz|KiB|MiB|GiB|KB/s|MB/s|GB/s|ms|us|ns|s)|\))$")


def _whole(last: str) -> bool:
    """Whether a last line without its newline is whole by the grammar of `nvidia-smi -q`: a
    "Key : value" line (a section title or GPU header always has lines after it) whose value is
    not read, or is one that cannot be a prefix of another (a Yes/No flag, a word such as
    "Completed", a number with its unit, a zero count)."""
    line = last.strip()
    if not line or _BANNER.match(line):
        return True
    match = _KEY_VALUE.match(line)
    if match is None or not (value := (match.group("value") or "").strip()):
        return False
    key = _norm(match.group("key"))
    if key not in _READ_KEYS:
        return True  # nothing on it is read ("EGM : disabled", "Used GPU Memory : 6482 MiB")
    word = value.lower()
    flag = any(key == flag_key for _, flag_key in _FLAGS)
    return word in _WHOLE_WORDS or (flag and word == "no") or _WITH_UNIT.search(value) is not None


def parse_nvsmi_text(text: str) -> GpuInventory:
    """`nvidia-smi -q` output (full, or a `-d` partial view) → GpuInventory.

    Raises ToolReportedFailure when nvidia-smi printed a driver failure instead of data, and
    ParseError when the output is not nvidia-smi -q output, or when it was cut short or damaged
    (README: "what fails a node, what makes it unknown"): fewer GPU blocks (plus lost GPUs) than
    "Attached GPUs" or more, a full GPU block that stops before its "Processes" section, a last line
    cut inside (one that is whole without its newline is read: _whole), a -d view whose blocks do
    not show the same sections, a block with a key twice or a flag that is not Yes/No. The
    ParseError then carries, as `partial`, the GPU blocks that are intact, so that a fault they
    state plainly is still reported.
    Never run with `-i`: a single-GPU selection also prints every attached GPU in the count.
    """
    failure = detect_tool_failure(text)
    if failure is not None:
        raise ToolReportedFailure(failure)
    lost = detect_lost_gpus(text)
    lines = text.splitlines()
    problems: list[str] = []
    if lines and not text.endswith(("\n", "\r")) and not _whole(lines[-1]):
        # A last line without its newline is read when it is whole by the grammar (a capture kept in
        # a repository lost only its newline); one whose value may be a prefix of the real one
        # ("Comp" of "Completed", "5" of "56") was cut inside and is not read.
        problems.append(f"cut short inside line {len(lines)}")
        lines = lines[:-1]
    root, banner = _tree(lines)
    blocks: list[tuple[str, _Node]] = []
    for node in root.children:
        header = _GPU_HEADER.match(node.key)
        if node.value is None and header is not None:
            blocks.append((header.group("pci"), node))

    if not banner and not blocks:
        stray = other_text(text)
        if lost and not problems and stray is None:
            return GpuInventory(source=SOURCE, lost=tuple(lost))
        if detect_no_devices(text) and not problems and stray is None:
            return GpuInventory(source=SOURCE, attached_gpus=0)
        raise ParseError(
            "not nvidia-smi -q output: no NVSMI LOG banner and no 'GPU <bus id>' block",
            partial=GpuInventory(source=SOURCE, lost=tuple(lost)) if lost else None,
        )

    attached = as_int(root.get("Attached GPUs"))
    if attached is None and not blocks and not lost and not detect_no_devices(text):
        raise ParseError("truncated nvidia-smi -q output: no 'Attached GPUs' line and no GPU block")
    if attached is None and blocks:
        # nvidia-smi prints it in every view: without it an excerpt looks like the whole node.
        problems.append("no 'Attached GPUs' line: how many GPUs the node has is not known")
    # Outside the GPU blocks nvidia-smi prints only "Key : value" lines (Timestamp, Driver Version,
    # CUDA Version, Attached GPUs). Indented lines under one of them belong to a GPU whose header was
    # lost; a line that is neither is not nvidia-smi's.
    for node in root.children:
        if _GPU_HEADER.match(node.key) and node.value is None:
            continue
        if node.children:
            problems.append(
                f"line {node.children[0].line}: indented lines outside any GPU block (a GPU header lost?)"
            )
            break
        if node.value is None:
            problems.append(f"line {node.line}: {node.key[:40]!r} is not a line of nvidia-smi -q")
            break
    garbled = [n.line for n in root.children if n.garbled]
    if garbled:
        problems.append(f"line {garbled[0]} holds bytes nvidia-smi never prints (NUL, not UTF-8)")
    if attached is not None and len(blocks) + len(lost) < attached:
        problems.append(
            f"'Attached GPUs : {attached}' but only {len(blocks)} GPU block(s) and {len(lost)} lost GPU "
            "line(s): cut short or an excerpt"
        )
    if attached is not None and len(blocks) + len(lost) > attached:
        problems.append(
            f"'Attached GPUs : {attached}' but {len(blocks)} GPU block(s) and {len(lost)} lost GPU line(s)"
        )
    trusted: list[tuple[str, _Node]] = []
    pcis = [normalize_pci(pci) for pci, _ in blocks]
    full_view = any(block.child("Product Name") is not None for _, block in blocks)
    sections = [{c.key for c in block.children} for _, block in blocks]
    for (pci, block), shown in zip(blocks, sections, strict=True):
        if pcis.count(normalize_pci(pci)) > 1:
            problems.append(f"GPU {pci} has two blocks (line {block.line})")
            continue
        damage = _block_damage(block)
        if damage is not None:
            problems.append(f"the block of GPU {pci} is damaged: {damage}")
            continue
        trusted.append((pci, block))
        if full_view and block.child("Processes") is None:
            problems.append(f"the block of GPU {pci} (line {block.line}) stops before 'Processes'")
        elif not full_view and len(blocks) > 1 and shown != set().union(*sections):
            problems.append(f"the block of GPU {pci} (line {block.line}) lacks sections other GPUs show")

    # Indices over every block, so that a GPU keeps its number when a block before it is damaged.
    gpus = assign_indices([_gpu(i, pci, block, lines) for i, (pci, block) in enumerate(blocks)], lost)
    keep = {id(block) for _, block in trusted}
    inventory = GpuInventory(
        source=SOURCE,
        driver_version=clean(root.get("Driver Version")),
        cuda_version=clean(root.get("CUDA Version")),
        attached_gpus=attached if attached is not None else (0 if detect_no_devices(text) else None),
        gpus=tuple(g for g, (_, block) in zip(gpus, blocks, strict=True) if id(block) in keep),
        lost=tuple(lost),
    )
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        raise ParseError("; ".join(problems[:3]) + more, partial=inventory)
    return inventory


def _where(b: _Node, lines: list[str]) -> dict[str, tuple[SourceLine, ...]]:
    where: dict[str, tuple[SourceLine, ...]] = {}
    for key, paths in WHERE_TEXT.items():
        nodes = [n for path in paths if (n := b.child(*path)) is not None and n.value is not None]
        if nodes:
            where[key] = tuple(SourceLine(n.line, lines[n.line - 1].strip()) for n in nodes)
    section = b.child("Clocks Event Reasons") or b.child("Clocks Throttle Reasons")
    if section is not None:
        reasons = [section.find(k) for k in ("HW Slowdown", "HW Thermal Slowdown", "HW Power Brake Slowdown")]
        found = tuple(SourceLine(n.line, lines[n.line - 1].strip()) for n in reasons if n is not None)
        if found:
            where["clock_events"] = found
    return where


def _gpu(index: int, header_pci: str, b: _Node, lines: list[str]) -> Gpu:
    return Gpu(
        where=_where(b, lines),
        index=index,
        pci_bus_id=normalize_pci(header_pci),
        name=clean(b.get("Product Name")),
        uuid=clean(b.get("GPU UUID")),
        serial=clean(b.get("Serial Number")),
        architecture=clean(b.get("Product Architecture")),
        persistence_mode=as_bool(b.get("Persistence Mode")),
        mig_mode=as_bool(b.get("MIG Mode", "Current")),
        ecc=_ecc(b),
        retired_pages=_retired_pages(b.child("Retired Pages")),
        remapped_rows=_remapped_rows(b.child("Remapped Rows")),
        clock_events=_clock_events(b),
        pcie=_pcie(b.child("PCI")),
        recovery_action=clean(b.get("GPU Recovery Action")),
        reset_required=as_bool(b.get("GPU Reset Status", "Reset Required")),
        drain_and_reset_recommended=as_bool(b.get("GPU Reset Status", "Drain and Reset Recommended")),
        fabric=fabric_or_none(clean(b.get("Fabric", "State")), clean(b.get("Fabric", "Status"))),
        power=text_power(b.get),
        thermal=_thermal(b.child("Temperature")),
        clocks=_clocks(b),
    )


def _sram_uncorrectable(scope: _Node | None) -> int | None:
    if scope is None:
        return None
    single = as_int(scope.get("SRAM Uncorrectable"))
    if single is not None:
        return single
    return add_optional(
        as_int(scope.get("SRAM Uncorrectable Parity")), as_int(scope.get("SRAM Uncorrectable SEC-DED"))
    )


def _ecc(b: _Node) -> EccErrors:
    errors = b.child("ECC Errors")
    vol = errors.child("Volatile") if errors is not None else None
    agg = errors.child("Aggregate") if errors is not None else None

    def get(scope: _Node | None, *path: str) -> str | None:
        return scope.get(*path) if scope is not None else None

    return EccErrors(
        mode_enabled=as_bool(b.get("ECC Mode", "Current")),
        volatile_dram_uncorrectable=as_int(get(vol, "DRAM Uncorrectable")),
        volatile_sram_uncorrectable=_sram_uncorrectable(vol),
        aggregate_dram_uncorrectable=as_int(get(agg, "DRAM Uncorrectable")),
        aggregate_sram_uncorrectable=_sram_uncorrectable(agg),
        volatile_dram_correctable=as_int(get(vol, "DRAM Correctable")),
        aggregate_dram_correctable=as_int(get(agg, "DRAM Correctable")),
        volatile_sram_correctable=as_int(get(vol, "SRAM Correctable")),
        aggregate_sram_correctable=as_int(get(agg, "SRAM Correctable")),
        sram_threshold_exceeded=as_bool(get(agg, "SRAM Threshold Exceeded")),
        volatile_double_bit_total=as_int(get(vol, "Double Bit", "Total")),
        aggregate_double_bit_total=as_int(get(agg, "Double Bit", "Total")),
        volatile_single_bit_total=as_int(get(vol, "Single Bit", "Total")),
    )


def _retired_pages(section: _Node | None) -> RetiredPages | None:
    if section is None:
        return None
    return retired_pages_or_none(
        as_int(section.get("Single Bit ECC")),
        as_int(section.get("Double Bit ECC")),
        any_true(
            as_bool(section.get("Pending Page Blacklist")),
            as_bool(section.get("Pending Page Retirement")),
            as_bool(section.get("Pending")),  # pre-R4xx wording
        ),
    )


def _remapped_rows(section: _Node | None) -> RemappedRows | None:
    if section is None or not section.children:  # absent, or "Remapped Rows : N/A"
        return None
    hist = section.child("Bank Remap Availability Histogram")

    def bucket(name: str) -> int | None:
        return as_int(hist.get(name)) if hist is not None else None

    return remapped_rows_or_none(
        as_int(section.get("Correctable Error")),
        as_int(section.get("Uncorrectable Error")),
        as_bool(section.get("Pending")),
        as_bool(section.get("Remapping Failure Occurred")),
        histogram_or_none(bucket("Max"), bucket("High"), bucket("Partial"), bucket("Low"), bucket("None")),
    )


def _clock_events(b: _Node) -> ClockEvents:
    section = b.child("Clocks Event Reasons") or b.child("Clocks Throttle Reasons")
    if section is None:
        return ClockEvents()

    def reason(key: str) -> bool | None:
        node = section.find(key)
        return as_bool(node.value) if node is not None else None

    return ClockEvents(
        hw_slowdown=reason("HW Slowdown"),
        hw_thermal_slowdown=reason("HW Thermal Slowdown"),
        hw_power_brake=reason("HW Power Brake Slowdown"),
        sw_power_cap=reason("SW Power Cap"),
        sw_thermal_slowdown=reason("SW Thermal Slowdown"),
        idle=reason("Idle"),
        applications_clocks_setting=reason("Applications Clocks Setting"),
        sync_boost=reason("Sync Boost"),
        display_clock_setting=reason("Display Clock Setting"),
    )


def _thermal(t: _Node | None) -> GpuThermal:
    if t is None:
        return GpuThermal()
    return GpuThermal(
        gpu_c=as_int(t.get("GPU Current Temp")),
        gpu_slowdown_c=as_int(t.get("GPU Slowdown Temp")),
        gpu_tlimit_margin_c=as_int(t.get("GPU T.Limit Temp")),
        gpu_slowdown_tlimit_c=as_int(t.get("GPU Slowdown T.Limit Temp")),
        memory_c=as_int(t.get("Memory Current Temp")),
        memory_max_c=as_int(t.get("Memory Max Operating Temp")),
    )


def _clocks(b: _Node) -> GpuClocks:
    app = as_int(b.get("Applications Clocks", "Graphics"))
    return GpuClocks(
        sm_mhz=as_int(b.get("Clocks", "SM")),
        applications_mhz=app if app is not None else as_int(b.get("Default Applications Clocks", "Graphics")),
        max_sm_mhz=as_int(b.get("Max Clocks", "SM")),
        utilization_percent=as_int(b.get("Utilization", "Gpu")),
    )


def _pcie(pci: _Node | None) -> PcieLink:
    if pci is None:
        return PcieLink()
    return PcieLink(
        gen_current=as_int(pci.get("GPU Link Info", "PCIe Generation", "Current")),
        gen_max=as_int(pci.get("GPU Link Info", "PCIe Generation", "Max")),
        width_current=as_int(pci.get("GPU Link Info", "Link Width", "Current")),
        width_max=as_int(pci.get("GPU Link Info", "Link Width", "Max")),
        replay_counter=as_int(pci.get("Replays Since Reset")),
    )
