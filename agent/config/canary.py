"""Which ConfigMap an agent runs: the main one, or the canary while its Node asks for it.

A config edit reaches every agent at once; a canary lets an SRE try it on a few nodes first. The
DaemonSet mounts `gpu-healthcheck-config-canary` as an optional ConfigMap volume beside the main
one (an empty directory while that ConfigMap does not exist). An agent runs the canary directory
while its own Node carries the label `<prefix>/config=canary` (read from the Node watch it already
has: no new API read) and that directory holds a config; otherwise the main directory.

A canary is a whole config: a file it lacks is the shipped one, as for the main ConfigMap, not the
main ConfigMap's. The digest names the content of the directory in force, so that `status -o wide`
shows which nodes run which config (same files, same digest).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib.abc import Traversable
from pathlib import Path

from agent.config import CONFIG_FILES, SHIPPED

MAIN, CANARY = "main", "canary"  # where the config in force was read
LAST_GOOD, SHIPPED_DEFAULTS = "last-good", "shipped"  # an agent started under an invalid config
DIGEST_CHARS = 12  # of the sha256 written in the results annotation


def files_digest(directory: Path | Traversable | None) -> str:
    """sha256 of the CONFIG_FILES of *directory* (None: the shipped ones), a missing file marked as
    such. The kubelet swaps a ConfigMap volume's `..data` link, so the content is what is compared."""
    h = hashlib.sha256()
    base = SHIPPED if directory is None else directory
    for name in CONFIG_FILES:
        try:
            h.update(name.encode() + b"\0" + (base / name).read_bytes() + b"\0")
        except OSError:
            h.update(name.encode() + b"\0-\0")
    return h.hexdigest()


def short(digest: str) -> str:
    return digest[:DIGEST_CHARS]


def has_config(directory: Path | None) -> bool:
    """The directory holds at least one config file: an absent optional ConfigMap mounts empty."""
    return directory is not None and any((directory / name).is_file() for name in CONFIG_FILES)


@dataclass(frozen=True)
class Choice:
    """One config directory the agent may run, and what it is called in Events and the annotation."""

    source: str  # MAIN | CANARY
    directory: Path | None

    def describe(self) -> str:
        where = f" ({self.directory})" if self.directory is not None else ""
        return f"the {self.source} ConfigMap{where}"


def choose(main: Path | None, canary: Path | None, wants_canary: bool | None, current: Choice) -> Choice:
    """The canary while the Node asks for it and its directory holds a config, else the main one;
    *wants_canary* None (the Node not seen yet): keep *current*."""
    if wants_canary is None:
        return current
    if wants_canary and has_config(canary):
        return Choice(CANARY, canary)
    return Choice(MAIN, main)


__all__ = [
    "CANARY",
    "LAST_GOOD",
    "MAIN",
    "SHIPPED_DEFAULTS",
    "Choice",
    "choose",
    "files_digest",
    "has_config",
    "short",
]
