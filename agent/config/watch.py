"""Notice a changed ConfigMap directory within seconds and validate it before it takes effect (DESIGN.md §7).

The kubelet updates a ConfigMap volume by swapping a `..data` symlink, so file mtimes are not
reliable: compare the content of the files instead (they are small). A valid config is adopted only
when the admission fence allows its condition types (*vet*, agent/reporters/config_proof.py); one it
refuses is asked about again every REVET_S while it stays mounted, so a policy updated after the
ConfigMap is picked up without another edit.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agent.config import CONFIG_FILES as FILES
from agent.config import Config, load_config_dir
from agent.config.canary import MAIN, Choice, choose, files_digest, short
from agent.config.last_good import Vet, save_last_good
from agent.config.schema import RESTART_ONLY, SCHEMA, ConfigError
from agent.core.rules import RuleBook

REVET_S = 60.0


@dataclass(frozen=True)
class ReloadOutcome:
    config: Config | None  # the new config when accepted (restart-only keys at their old values)
    error: str | None  # why it was rejected
    changed: tuple[str, ...] = ()  # the keys (dotted) and tables that changed and are applied
    needs_restart: tuple[str, ...] = ()  # "key: old → new" of the RESTART_ONLY keys not applied
    source: Choice = Choice(MAIN, None)  # the directory this outcome is about
    previous: Choice = Choice(MAIN, None)  # the one in force before (still in force when rejected)
    switched: bool = False  # the agent turned from one directory to the other (label, canary ConfigMap)


def flatten(raw: Mapping[str, Any], schema: Mapping[str, Any] = SCHEMA, where: str = "") -> dict[str, Any]:
    """config.yaml's document as dotted keys → values; a free-form section ("*") is one value."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        spec = schema.get(key)
        if isinstance(spec, Mapping) and "*" not in spec and isinstance(value, Mapping):
            out.update(flatten(value, spec, f"{where}{key}."))
        else:
            out[f"{where}{key}"] = value
    return out


def changed_keys(old: Config, new: Config) -> list[str]:
    """The config.yaml keys and the tables whose values differ between two configs."""
    a, b = flatten(old.raw), flatten(new.raw)
    keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    tables = {
        "instance-profiles.yaml": (old.profiles, new.profiles),
        "xid-catalog.yaml": (old.xid_catalog, new.xid_catalog),
        "dcgm-incidents.yaml": (old.dcgm_incidents, new.dcgm_incidents),
    }
    return keys + [name for name, (x, y) in tables.items() if x != y and name not in keys]


def keep_restart_only(old: Config, new: Config) -> tuple[Config, list[str]]:
    """*new* with the RESTART_ONLY keys at their values in *old*, and "key: old → new" for each."""
    raw = copy.deepcopy(new.raw)
    kept: list[str] = []
    for dotted in RESTART_ONLY:
        *parents, leaf = dotted.split(".")
        src, dst = old.raw, raw
        for p in parents:
            src, dst = src[p], dst[p]
        if src[leaf] != dst[leaf]:
            kept.append(f"{dotted}: {src[leaf]} → {dst[leaf]}")
            dst[leaf] = src[leaf]
    return (replace(new, raw=raw) if kept else new), kept


class ConfigWatcher:
    def __init__(
        self,
        directory: Path | None,
        current: Config,
        rules: RuleBook | None = None,
        state_dir: Path | None = None,
        *,
        canary_dir: Path | None = None,
        wants_canary: Callable[[], bool | None] | None = None,
        vet: Vet | None = None,
        fence_refused: bool = False,
    ) -> None:
        """current: the config in force (at start maybe a fallback, when the mounted one is invalid);
        state_dir: where each accepted config is kept (last_good); canary_dir and wants_canary (the
        Node's `<prefix>/config=canary` label; None while the Node is not seen): config/canary.py;
        vet: why the admission fence refuses a config (None: it allows it); fence_refused: it refused
        the mounted one at start."""
        self.directory = directory
        self.canary_dir = canary_dir
        self.wants_canary = wants_canary
        self.state_dir = state_dir
        self.current = current
        self.rules = rules
        self.watching = Choice(MAIN, directory)  # the directory polled (an invalid canary stays here)
        self.in_force = Choice(MAIN, directory)  # at start always the main one (or its fallback)
        self.vet = vet
        self._refused_at = time.monotonic() if fence_refused else None  # the mounted one, by the fence
        self._fingerprint = self._digest()
        self._last_stamp = self._stamp()

    def _digest(self) -> str:
        return files_digest(self.watching.directory) if self.watching.directory is not None else ""

    def _stamp(self) -> tuple[tuple[int, int, int], ...]:
        """Cheap change detector (inode, mtime, size through the kubelet's symlinks); the content
        hash decides."""
        if self.watching.directory is None:
            return ()
        out = []
        for name in FILES:
            try:
                st = os.stat(os.path.join(self.watching.directory, name))
                out.append((st.st_ino, st.st_mtime_ns, st.st_size))
            except OSError:
                out.append((0, 0, -1))
        return tuple(out)

    def _revet_due(self) -> bool:
        return self._refused_at is not None and time.monotonic() - self._refused_at >= REVET_S

    def poll(self) -> ReloadOutcome | None:
        """None when nothing changed (or the fence still refuses the same config); else the accepted
        config or the rejection reason. A switch between the main and the canary directory loads the
        other one whether or not it changed."""
        wants = self.wants_canary() if self.wants_canary is not None and self.canary_dir else False
        choice = choose(self.directory, self.canary_dir, wants, self.watching)
        switched = choice != self.watching
        if switched:
            self.watching, self._fingerprint, self._refused_at = choice, "", None
        revet = self._revet_due()
        stamp = self._stamp()
        if stamp == self._last_stamp and not switched and not revet:
            return None
        self._last_stamp = stamp
        digest = self._digest()
        if digest == self._fingerprint and not revet:
            return None
        same = digest == self._fingerprint
        self._fingerprint = digest
        was = self.in_force
        self._refused_at = None
        try:
            loaded = load_config_dir(self.watching.directory, rules=self.rules)
        except ConfigError as exc:
            return ReloadOutcome(config=None, error=str(exc), source=choice, previous=was, switched=switched)
        refusal = self.vet(loaded) if self.vet is not None else None
        if refusal is not None:
            self._refused_at = time.monotonic()
            if same:
                return None
            return ReloadOutcome(config=None, error=refusal, source=choice, previous=was, switched=switched)
        save_last_good(self.watching.directory, self.state_dir)
        loaded = replace(loaded, source=choice.source, digest=short(digest))
        cfg, kept = keep_restart_only(self.current, loaded)
        changed = changed_keys(self.current, cfg)
        self.current, self.in_force = cfg, choice
        return ReloadOutcome(
            config=cfg,
            error=None,
            changed=tuple(changed),
            needs_restart=tuple(kept),
            source=choice,
            previous=was,
            switched=switched,
        )
