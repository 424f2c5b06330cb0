"""The topology check: judge the `nvidia-smi topo -m` matrix against the instance profile.

Rules (anchors.md §9.5): GPU rows must match the profile's GPU count; an "X" off the diagonal
means the driver sees a GPU link as itself (a disconnected link); where NVLink is expected every
GPU pair must read NV<n>; where the profile names a NIC affinity, each GPU's nearest NIC must be
at least that close.
"""

from __future__ import annotations

import re

from agent.checks import CheckSpec, partial_input, rule_finding
from agent.config import Config
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult, Evidence, Finding
from agent.core.profile import TOPO_LEVELS
from agent.core.rules import Rule
from agent.core.severity import Severity
from agent.core.topo import TopoMatrix

GPU_COUNT = Rule("topology.gpu-count", Severity.ISOLATE, "topo -m GPU rows differ from the profile")
X_OFF_DIAGONAL = Rule("topology.x-off-diagonal", Severity.ISOLATE, "an X off the diagonal of topo -m")
NOT_NV_CONNECTED = Rule(
    "topology.not-nv-connected",
    Severity.ISOLATE,
    "NVLink expected but a GPU pair is not NV-connected",
)
NIC_AFFINITY = Rule(
    "topology.nic-affinity",
    Severity.MONITOR,
    "GPU-to-NIC affinity worse than the profile expects",
)


NAME = "topology"
_NV = re.compile(r"^NV\d+$")
# Older drivers print SOC where newer ones print SYS.
_ALIASES = {"SOC": "SYS"}


def _finding(
    cfg: Config, rule: Rule, message: str, entities: tuple[str, ...], key: str, topo: TopoMatrix
) -> Finding:
    """Its evidence: the rows of the devices it names that were read (the header for the count)."""
    lines = [topo.row_lines[e] for e in entities if e in topo.row_lines]
    if not entities and topo.header_line is not None:
        lines = [topo.header_line]
    return rule_finding(cfg, NAME, rule, message, entities, key, Evidence.of(topo.source, tuple(lines)))


def _rank(cell: str) -> int | None:
    """Position of a PCIe path code in TOPO_LEVELS (0 best); NV# counts as best; unknown → None."""
    cell = _ALIASES.get(cell, cell)
    if _NV.match(cell):
        return 0
    return TOPO_LEVELS.index(cell) if cell in TOPO_LEVELS else None


def _x_off_diagonal(cfg: Config, topo: TopoMatrix) -> list[Finding]:
    out = []
    for row in topo.gpu_rows:
        for col, cell in topo.rows[row].items():
            if cell == "X" and col != row:
                out.append(
                    _finding(
                        cfg,
                        X_OFF_DIAGONAL,
                        f"{row}: topo -m shows X (self) towards {col}: the link to {col} is not seen",
                        (row, col),
                        f"{row}-{col}",
                        topo,
                    )
                )
    return out


def _not_nv(cfg: Config, topo: TopoMatrix) -> list[Finding]:
    """Each unordered GPU pair once; a pair is fine when every cell naming it reads NV<n>."""
    out = []
    seen: set[frozenset[str]] = set()
    gpus = [c for c in topo.columns if c.startswith("GPU")]
    for row in topo.gpu_rows:
        for col in gpus:
            pair = frozenset((row, col))
            if col == row or pair in seen:
                continue
            seen.add(pair)
            cells = [topo.rows[row].get(col, "")]
            if col in topo.rows:
                cells.append(topo.rows[col].get(row, ""))
            bad = [c for c in cells if c != "X" and not _NV.match(c)]  # X off the diagonal: own rule
            if bad:
                # In header order, so that the pair keeps its key whichever of its rows was read.
                a, b = sorted((row, col), key=topo.columns.index)
                out.append(
                    _finding(
                        cfg,
                        NOT_NV_CONNECTED,
                        f"{a} and {b} are connected by {bad[0] or 'nothing'}, not NVLink",
                        (a, b),
                        f"{a}-{b}",
                        topo,
                    )
                )
    return out


def _nic_affinity(cfg: Config, topo: TopoMatrix, worst: str) -> tuple[list[Finding], str]:
    nics = [c for c in topo.columns if c.startswith("NIC")]
    if not nics:
        return [], "no NIC in topo -m: NIC affinity not judged"
    limit = TOPO_LEVELS.index(worst)
    out = []
    for row in topo.gpu_rows:
        ranked = [(r, nic) for nic in nics if (r := _rank(topo.rows[row].get(nic, ""))) is not None]
        if not ranked:
            continue
        best, nic = min(ranked)
        if best > limit:
            name = topo.nic_names.get(nic, nic)
            out.append(
                _finding(
                    cfg,
                    NIC_AFFINITY,
                    f"{row}: nearest NIC {name} is {TOPO_LEVELS[best]}, profile expects {worst} or closer",
                    (row, name),
                    row,
                    topo,
                )
            )
    return out, f"every GPU has a NIC at {worst} or closer"


def check_topology(facts: NodeFacts, cfg: Config) -> CheckResult:
    """On a damaged matrix (rows lost or cut), the intact rows under the intact header are judged:
    the GPU count is the header's, a cell rule needs the row that holds the cell, and the result is
    also `unknown`."""
    got = partial_input(NAME, facts.topo, TopoMatrix)
    if isinstance(got, CheckResult):
        return got
    topo, unreadable = got
    gpu_count = sum(1 for c in topo.columns if c.startswith("GPU"))
    findings = _x_off_diagonal(cfg, topo)
    nic_count = sum(1 for c in topo.columns if c.startswith("NIC"))
    notes = [f"{gpu_count} GPU(s), {nic_count} NIC(s)"]
    prof = facts.profile
    if prof is None:
        which = f" (no profile for {facts.instance_type!r})" if facts.instance_type else ""
        notes.append(f"instance type unknown{which}: count and NVLink rules skipped")
    else:
        if gpu_count != prof.gpu_count:
            findings.append(
                _finding(
                    cfg,
                    GPU_COUNT,
                    f"topo -m shows {gpu_count} GPU(s), {prof.instance_type} has {prof.gpu_count}",
                    (),
                    "count",
                    topo,
                )
            )
        if prof.nvlink:
            findings += _not_nv(cfg, topo)
            notes.append("all GPU pairs NVLink-connected")
        if prof.nic_affinity:
            more, note = _nic_affinity(cfg, topo, prof.nic_affinity)
            findings += more
            notes.append(note)
    if unreadable is not None:
        return CheckResult(NAME, findings=tuple(findings), unknown=unreadable)
    return CheckResult(NAME, findings=tuple(findings), note="; ".join(notes))


CHECKS = (
    CheckSpec(
        "topology",
        check_topology,
        (Input.TOPO,),
        "topology",
        (GPU_COUNT, X_OFF_DIAGONAL, NOT_NV_CONNECTED, NIC_AFFINITY),
    ),
)
