"""Parse `nvidia-smi topo -m`: the GPU/NIC connection matrix the topology check judges.

The tool prints a tab-separated matrix (sometimes re-padded with spaces by whoever captured it, and
with ANSI underline escapes around the header on newer drivers), then a Legend and a "NIC Legend"
mapping NIC0.. to RDMA device names. Columns may also be named after the RDMA device directly
(mlx5_0 ...); those are renamed NIC0.. in order and the real name kept in nic_names, so that the
checks see one shape.
"""

from __future__ import annotations

import re

from agent.core.probed import ParseError, SourceLine
from agent.core.topo import TopoMatrix

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# The trailing, non-device header columns, in the order nvidia-smi prints them.
_AFFINITY_HEAD = re.compile(r"\b(CPU Affinity|NUMA Affinity|GPU NUMA ID)\b")
_GPU = re.compile(r"^GPU\d+$")
_NIC = re.compile(r"^NIC\d+$")
# Device names other than GPUn/NICn: lower-case RDMA/net names such as mlx5_0, mlx5_bond_0, rdmap79s0.
_OTHER_DEV = re.compile(r"^[a-z][a-z0-9_.\-]*\d$")
# A matrix cell: X, SYS, NODE, PHB, PXB, PIX, NV18, older SOC. Nothing else: "N" cut from "NV18"
# or "PI" from "PIX" is a damaged row, not a connection.
_CELL = re.compile(r"^(X|SYS|NODE|PHB|PXB|PIX|SOC|NV\d+)$")
_NIC_LEGEND = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")


def _is_device(token: str) -> bool:
    return bool(_GPU.match(token) or _NIC.match(token) or _OTHER_DEV.match(token))


def _header(line: str) -> tuple[list[str], bool] | None:
    """The device columns of a header line and whether affinity columns follow, or None."""
    m = _AFFINITY_HEAD.search(line)
    devices_part = line[: m.start()] if m else line
    tokens = devices_part.split()
    if not tokens or not all(_is_device(t) for t in tokens):
        return None
    if not any(_GPU.match(t) for t in tokens):
        return None
    return tokens, m is not None


def _rename_nics(columns: list[str]) -> tuple[list[str], dict[str, str]]:
    """Columns named after devices (mlx5_0) become NIC0.. in order; returns new names and NICk→name."""
    others = [c for c in columns if not _GPU.match(c)]
    if all(_NIC.match(c) for c in others):
        return columns, {}
    renamed: dict[str, str] = {}
    out: list[str] = []
    n = 0
    for col in columns:
        if _GPU.match(col):
            out.append(col)
        else:
            nic = f"NIC{n}"
            n += 1
            renamed[col] = nic
            out.append(nic)
    return out, {v: k for k, v in renamed.items()}


def _row_cut(tokens: list[str], known: bool, ncols: int) -> bool:
    """Whether a matrix row that ends the text without its newline was cut inside: an unknown name
    (a cut "GP"), fewer cells than the header has, a cell that is no code ("N", "PI"), or a last cell
    that may have lost digits ("NV1" of "NV18"). Cells followed by the affinity columns are whole."""
    cells = tokens[1 : 1 + ncols]
    if not known or len(cells) < ncols or not all(_CELL.match(c) for c in cells):
        return True
    return len(tokens) == 1 + ncols and cells[-1].startswith("NV")


def parse_topo(text: str) -> TopoMatrix:
    """Parse `nvidia-smi topo -m` output; raises ParseError when no GPU matrix is found, or when the
    matrix contradicts itself or stops early (docs/checks.md: "what fails a node, what makes it unknown"):
    a device of the header without its row (rows lost or cut), a row cut short, twice, out of order
    or with a cell that is no topo code, a row whose own cell is not X, a last line cut inside (a
    last line that is whole without its newline is read). The intact rows under the intact header
    are then kept as `partial`.
    """
    lines = [_ANSI.sub("", ln).rstrip("\r\n") for ln in text.splitlines()]
    problems: list[str] = []
    # The last line without its newline is read when it is whole by the grammar (see _row_cut); a
    # line cut inside it ("N" of "NV18", a row short of cells) is never read.
    open_line = len(lines) if lines and not text.endswith(("\n", "\r")) else 0
    start = None
    head: tuple[list[str], bool] | None = None
    for i, line in enumerate(lines):
        head = _header(line)
        if head is not None:
            start = i
            break
    if start is None or head is None:
        raise ParseError("no topo -m header row (GPU0 ...) found")
    # nvidia-smi prints the header first (after its own warnings, e.g. a corrupted infoROM): a
    # matrix further down another text is another tool's output quoting one, not this node's.
    before = [ln for ln in lines[:start] if ln.strip() and not ln.strip().upper().startswith("WARNING")]
    if before:
        raise ParseError(f"not nvidia-smi topo -m output: {before[0].strip()[:60]!r} before the header")
    raw_columns, has_affinity = head
    if len(set(raw_columns)) != len(raw_columns):
        raise ParseError("topo -m header names a device twice")
    columns, nic_names = _rename_nics(raw_columns)
    by_raw = dict(zip(raw_columns, columns, strict=True))
    ncols = len(columns)

    rows: dict[str, dict[str, str]] = {}
    row_lines: dict[str, SourceLine] = {}
    cpu: dict[str, str] = {}
    numa: dict[str, str] = {}
    i = start + 1
    while i < len(lines):
        line = lines[i]
        tokens = line.split()
        i += 1
        if not tokens:
            break  # the blank line before the Legend ends the matrix
        name = tokens[0]
        if name.rstrip(":") in ("Legend", "NIC") and name not in by_raw:
            break
        if i == open_line and _row_cut(tokens, name in by_raw, ncols):
            problems.append(f"cut short inside line {i}")
            continue
        if name not in by_raw:
            problems.append(f"line {i}: unexpected row {name[:40]!r} in the topo matrix")
            continue
        cells = tokens[1 : 1 + ncols]
        row_name = by_raw[name]
        if len(cells) < ncols:
            problems.append(f"line {i}: row {name} has {len(cells)} cells, expected {ncols} (truncated?)")
            continue
        bad = [c for c in cells if not _CELL.match(c)]
        if bad:
            problems.append(f"line {i}: row {name}: unexpected cell {bad[0][:20]!r}")
            continue
        row = dict(zip(columns, cells, strict=True))
        if row[row_name] != "X":
            problems.append(f"line {i}: row {name} does not read X towards itself")
            continue
        if row_name in rows:
            problems.append(f"line {i}: row {name} appears twice")
            continue
        rows[row_name] = row
        row_lines[row_name] = SourceLine(i, line.strip())
        extra = tokens[1 + ncols :]
        if has_affinity and extra and i != open_line:  # a last value without its newline may be cut
            cpu[row_name] = extra[0]
            if len(extra) > 1:
                numa[row_name] = extra[1]
    if not rows:
        raise ParseError("topo -m header without any device row" + (f" ({problems[0]})" if problems else ""))
    missing = [c for c in columns if c not in rows]
    if missing:
        problems.append(
            f"the header names {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''} but the "
            "matrix has no row for it (rows lost or cut short)"
        )

    for line in lines[i : len(lines) - (1 if open_line else 0)]:  # a last name may be cut: unread
        m = _NIC_LEGEND.match(line)
        if m and m.group(1) in columns:
            nic_names.setdefault(m.group(1), m.group(2))
    matrix = TopoMatrix(
        columns=tuple(columns),
        rows=rows,
        nic_names=nic_names,
        cpu_affinity=cpu,
        numa_affinity=numa,
        row_lines=row_lines,
        header_line=SourceLine(start + 1, lines[start].strip()),
    )
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        raise ParseError("; ".join(problems[:3]) + more, partial=matrix)
    return matrix
