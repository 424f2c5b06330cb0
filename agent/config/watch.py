"""Notice a changed ConfigMap directory within seconds and validate it before it takes effect.

The kubelet updates a ConfigMap volume by swapping a `..data` symlink, so file mtimes are not
reliable: compare the content of the files instead (they are small).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from agent.config import CONFIG_FILES as FILES
from agent.config import Config, ConfigError, load_config_dir
from agent.core.rules import RuleBook


@dataclass(frozen=True)
class ReloadOutcome:
    config: Config | None  # the new config when accepted
    error: str | None  # why it was rejected


class ConfigWatcher:
    def __init__(self, directory: Path | None, current: Config, rules: RuleBook | None = None) -> None:
        self.directory = directory
        self.current = current
        self.rules = rules
        self._fingerprint = self._digest()
        self._last_stamp = self._stamp()

    def _digest(self) -> str:
        if self.directory is None:
            return ""
        h = hashlib.sha256()
        for name in FILES:
            path = self.directory / name
            try:
                h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
            except OSError:
                h.update(name.encode() + b"\0-\0")
        return h.hexdigest()

    def _stamp(self) -> tuple[tuple[int, int, int], ...]:
        """Cheap change detector (inode, mtime, size through the kubelet's symlinks); the content
        hash decides."""
        if self.directory is None:
            return ()
        out = []
        for name in FILES:
            try:
                st = os.stat(os.path.join(self.directory, name))
                out.append((st.st_ino, st.st_mtime_ns, st.st_size))
            except OSError:
                out.append((0, 0, -1))
        return tuple(out)

    def poll(self) -> ReloadOutcome | None:
        """None when nothing changed; else the accepted config or the rejection reason."""
        stamp = self._stamp()
        if stamp == self._last_stamp:
            return None
        self._last_stamp = stamp
        digest = self._digest()
        if digest == self._fingerprint:
            return None
        self._fingerprint = digest
        try:
            cfg = load_config_dir(self.directory, rules=self.rules)
        except ConfigError as exc:
            return ReloadOutcome(config=None, error=str(exc))
        self.current = cfg
        return ReloadOutcome(config=cfg, error=None)
