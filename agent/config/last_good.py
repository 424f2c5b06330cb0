"""Start under a bad ConfigMap without taking the node down (issue: a bad edit must not crash-loop a
fleet whose agents restart all the time, nor an image rolled back under a ConfigMap with newer keys).

Every config the agent accepts is copied to a state directory (an emptyDir: it survives a container
restart, not a new pod). An agent that starts under an invalid config runs on that last good copy,
or, when it has none, on the shipped defaults, and says why (ConfigRejected Event, metric and
condition reason). `gpu-healthcheck config validate DIR` runs the same load_config_dir. A config the
admission fence refuses (its condition types; the agent's *vet*, agent/reporters/config_proof.py)
counts as invalid here too: the agent never starts on types the fence would refuse it.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from agent.config import CONFIG_FILES, Config, load_config_dir
from agent.config.canary import LAST_GOOD as FROM_LAST_GOOD
from agent.config.canary import MAIN, SHIPPED_DEFAULTS, files_digest, short
from agent.config.schema import ConfigError
from agent.core.rules import RuleBook

log = logging.getLogger("gpu-healthcheck.config")

LAST_GOOD = "last-good-config"


@dataclass(frozen=True)
class StartConfig:
    config: Config
    problem: str = ""  # why the mounted config is not the one in force ("" = it is)
    fence_refused: bool = False  # the admission fence refused the mounted config's condition types


Vet = Callable[[Config], "str | None"]  # why the admission fence refuses a config, or None


def save_last_good(config_dir: Path | None, state_dir: Path | None) -> None:
    """Copy the accepted directory's files to state_dir/last-good-config (replaced whole, atomically
    by rename, so a crash mid-copy never leaves half a config). Best effort: a failure is logged."""
    if config_dir is None or state_dir is None:
        return
    target = state_dir / LAST_GOOD
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".last-good-", dir=state_dir))
        for name in CONFIG_FILES:
            if (config_dir / name).is_file():
                shutil.copyfile(config_dir / name, tmp / name)
        old = state_dir / ".last-good-old"
        if target.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.rename(target, old)
        os.rename(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        log.warning(f"could not keep a copy of the last good config in {state_dir}: {exc}")


def load_at_start(
    config_dir: Path | None, state_dir: Path | None, rules: RuleBook | None, vet: Vet | None = None
) -> StartConfig:
    """The mounted config; when it is invalid or the fence refuses it (*vet*), the last good copy
    the fence allows, else the shipped defaults (kept even when the fence refuses them: the
    API server then refuses the agent's status writes, fail closed, and the problem says so)."""
    refused = False
    try:
        cfg = load_config_dir(config_dir, rules=rules)
    except ConfigError as exc:
        error = str(exc)
    else:
        refusal = vet(cfg) if vet is not None else None
        if refusal is None:
            save_last_good(config_dir, state_dir)
            return StartConfig(replace(cfg, source=MAIN, digest=short(files_digest(config_dir))))
        error, refused = refusal, True
    kept = state_dir / LAST_GOOD if state_dir is not None else None
    if kept is not None and kept.is_dir():
        try:
            last = load_config_dir(kept, rules=rules)
            last = replace(last, source=FROM_LAST_GOOD, digest=short(files_digest(kept)))
        except ConfigError as exc:  # an older copy this version cannot read either
            log.warning(f"the last good config in {kept} is not valid either: {exc}")
        else:
            refusal = vet(last) if vet is not None else None
            if refusal is None:
                return StartConfig(last, f"running on the last good configuration: {error}", refused)
            log.warning(f"the last good config in {kept} is refused too: {refusal}")
    shipped = load_shipped(rules)
    # What is in force comes first: a condition's message is cut at its end, and the error (an
    # unknown key lists every allowed one) may be long.
    head = "running on the shipped default configuration"
    if vet is not None and (refusal := vet(shipped)) is not None:
        head += f", which the fence refuses too ({refusal})"
    return StartConfig(shipped, f"{head}: {error}", refused)


def load_shipped(rules: RuleBook | None) -> Config:
    """The shipped defaults (package data), whatever $GPU_HEALTHCHECK_CONFIG_DIR says."""
    cfg = load_config_dir(None, rules=rules, shipped_only=True)
    return replace(cfg, source=SHIPPED_DEFAULTS, digest=short(files_digest(None)))
