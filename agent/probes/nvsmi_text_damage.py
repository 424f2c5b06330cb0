"""Whether a `nvidia-smi -q` block or last line was damaged after nvidia-smi wrote it (lines lost,
moved, repeated or cut): nvidia-smi's grammar, which a damaged output breaks. The keys read come
from the field table (agent.probes.gpu_fields), so a new row is checked as soon as it is read."""

from __future__ import annotations

import re

from agent.probes.gpu_fields import FIELDS
from agent.probes.nvsmi_text_tree import ANY_DEPTH, BANNER, KEY_VALUE, Node, norm
from agent.probes.nvsmi_values import clean

_TEXT_PATHS = [path for f in FIELDS for path in (*f.text, *f.fallback_text)]

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
_READ_SECTIONS = {norm(path[0]) for path in _TEXT_PATHS}


def block_damage(block: Node) -> str | None:
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
    norm(k)
    for k in (
        *(key for path in _TEXT_PATHS for key in path if key != ANY_DEPTH),
        *(key for keys in _JUDGED_KEYS.values() for key in keys),
        *(key for _, key in _FLAGS),
        *("Attached GPUs", "Driver Version", "CUDA Version"),
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


def whole(last: str) -> bool:
    """Whether a last line without its newline is whole by the grammar of `nvidia-smi -q`: a
    "Key : value" line (a section title or GPU header always has lines after it) whose value is
    not read, or is one that cannot be a prefix of another (a Yes/No flag, a word such as
    "Completed", a number with its unit, a zero count)."""
    line = last.strip()
    if not line or BANNER.match(line):
        return True
    match = KEY_VALUE.match(line)
    if match is None or not (value := (match.group("value") or "").strip()):
        return False
    key = norm(match.group("key"))
    if key not in _READ_KEYS:
        return True  # nothing on it is read ("EGM : disabled", "Used GPU Memory : 6482 MiB")
    word = value.lower()
    flag = any(key == flag_key for _, flag_key in _FLAGS)
    return word in _WHOLE_WORDS or (flag and word == "no") or _WITH_UNIT.search(value) is not None
