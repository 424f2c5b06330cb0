"""Parse plain `nvidia-smi -q` (and `-q -d SECTION` views) into the GPU model.

The output is read as an indentation tree (nvsmi_text_tree), checked for damage (nvsmi_text_damage),
and each GPU block's values are read by their full section paths in the field table (gpu_fields):
this module decides which blocks are GPUs and whether the output is whole."""

from __future__ import annotations

import re

from agent.core.gpu import Gpu, GpuInventory
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
from agent.probes.nvsmi_text_damage import block_damage, whole
from agent.probes.nvsmi_text_tree import Node, tree
from agent.probes.nvsmi_values import as_int, assign_indices, clean

SOURCE = "nvidia-smi -q"
_GPU_HEADER = re.compile(r"^gpu\s+(?P<pci>[0-9a-f]{1,8}:[0-9a-f]{1,2}:[0-9a-f]{1,2}\.[0-9a-f])$", re.I)
_WHERE = where_paths("text")


def parse_nvsmi_text(text: str) -> GpuInventory:
    """`nvidia-smi -q` output (full, or a `-d` partial view) → GpuInventory.

    Raises ToolReportedFailure when nvidia-smi printed a driver failure instead of data, and
    ParseError when the output is not nvidia-smi -q output, or when it was cut short or damaged
    (docs/checks.md: "what fails a node, what makes it unknown"): fewer GPU blocks (plus lost GPUs) than
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
    if lines and not text.endswith(("\n", "\r")) and not whole(lines[-1]):
        # A last line without its newline is read when it is whole by the grammar (a capture kept in
        # a repository lost only its newline); one whose value may be a prefix of the real one
        # ("Comp" of "Completed", "5" of "56") was cut inside and is not read.
        problems.append(f"cut short inside line {len(lines)}")
        lines = lines[:-1]
    root, banner = tree(lines)
    blocks: list[tuple[str, Node]] = []
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
    trusted: list[tuple[str, Node]] = []
    pcis = [normalize_pci(pci) for pci, _ in blocks]
    full_view = any(block.child("Product Name") is not None for _, block in blocks)
    sections = [{c.key for c in block.children} for _, block in blocks]
    for (pci, block), shown in zip(blocks, sections, strict=True):
        if pcis.count(normalize_pci(pci)) > 1:
            problems.append(f"GPU {pci} has two blocks (line {block.line})")
            continue
        damage = block_damage(block)
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


def _where(b: Node, lines: list[str]) -> dict[str, tuple[SourceLine, ...]]:
    """The lines each Gpu.where key rests on (the field table's evidence paths that are printed)."""
    where: dict[str, tuple[SourceLine, ...]] = {}
    for key, paths in _WHERE.items():
        nodes = [n for path in paths if (n := b.child(*path)) is not None and n.value is not None]
        if nodes:
            where[key] = tuple(SourceLine(n.line, lines[n.line - 1].strip()) for n in nodes)
    return where


def _gpu(index: int, header_pci: str, b: Node, lines: list[str]) -> Gpu:
    """One GPU block, every field read by its row of the field table."""
    values = read_view(lambda path: b.get(*path), "text")
    return Gpu(
        index=index, pci_bus_id=normalize_pci(header_pci), where=_where(b, lines), **model_parts(values)
    )
