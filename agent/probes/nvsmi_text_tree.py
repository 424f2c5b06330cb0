"""The indentation tree of `nvidia-smi -q` output: "Key : value" lines and section titles, each under
the last line less indented than it. Values are looked up by their full section path, never by a bare
key: "Pending" is a pending MIG mode under "MIG Mode", a pending ECC mode under "ECC Mode", and a
fault (row remap pending, needs a reset) under "Remapped Rows"."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

from agent.probes.nvsmi_errors import is_lost_gpu_line

BANNER = re.compile(r"^=+\s*NVSMI LOG\s*=+$")
# "Key<spaces>: value". The colon must follow whitespace, so bus ids in values and headers stay whole.
KEY_VALUE = re.compile(r"^(?P<key>\S.*?)\s+:(?:\s+(?P<value>.*))?$")
# Control characters other than tab, and U+FFFD (bytes that were not UTF-8): never in nvidia-smi's
# output, so a line holding one was damaged ("Comp\x00leted" must not read as a fabric state).
_GARBLED = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd]")
ANY_DEPTH = "**"  # in a path: the next key at any depth below (clock reasons nest under HW Slowdown)


@dataclass
class Node:
    key: str  # normalised: lower case, single spaces
    value: str | None  # raw text after the colon; None for a section header
    indent: int
    line: int
    children: list[Node] = field(default_factory=list)
    garbled: bool = False  # the line holds bytes nvidia-smi never prints (NUL, not UTF-8)
    after_blank: bool = False  # a blank line came just before it
    _first: dict[str, Node] | None = field(default=None, repr=False, compare=False)

    def _child(self, key: str) -> Node | None:
        """The first child with this normalised key (indexed on first use: the tree is complete)."""
        if self._first is None:
            self._first = {}
            for c in self.children:
                self._first.setdefault(c.key, c)
        return self._first.get(key)

    def child(self, *path: str) -> Node | None:
        """First node along a path of keys (case-insensitive; ANY_DEPTH: at any depth), or None."""
        node: Node | None = self
        keys = iter(path)
        for key in keys:
            if node is None:
                return None
            if key == ANY_DEPTH:
                node = node.find(next(keys))
                continue
            node = node._child(norm(key))
        return node

    def get(self, *path: str) -> str | None:
        node = self.child(*path)
        return node.value if node is not None else None

    def find(self, key: str) -> Node | None:
        """First descendant with this key at any depth."""
        want = norm(key)
        stack = list(reversed(self.children))
        while stack:
            node = stack.pop()
            if node.key == want:
                return node
            stack.extend(reversed(node.children))
        return None


@lru_cache(maxsize=4096)
def norm(key: str) -> str:
    return " ".join(key.split()).lower()


def tree(lines: list[str]) -> tuple[Node, bool]:
    """Indentation tree of the output, without banner and lost-GPU lines; and whether the banner
    was seen."""
    root = Node(key="", value=None, indent=-1, line=0)
    stack = [root]
    banner = False
    blank = False
    for number, raw in enumerate(lines, start=1):
        line = raw.expandtabs(4).rstrip()
        stripped = line.strip()
        if not stripped:
            blank = True
            continue
        if BANNER.match(stripped):
            banner = True
            continue
        if is_lost_gpu_line(stripped):
            continue
        indent = len(line) - len(line.lstrip(" "))
        match = KEY_VALUE.match(stripped)
        if match:
            node = Node(norm(match.group("key")), match.group("value") or "", indent, number)
        else:
            node = Node(norm(stripped), None, indent, number)
        node.garbled = _GARBLED.search(stripped) is not None
        node.after_blank, blank = blank, False
        while stack[-1].indent >= indent:
            stack.pop()
        stack[-1].children.append(node)
        stack.append(node)
    return root, banner
