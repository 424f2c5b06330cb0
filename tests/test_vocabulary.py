"""Each closed vocabulary the agent writes is its own enum (core/vocabulary.py): its words are the ones
on the wire today, word for word; no name means two things; and a word of one vocabulary handed to a
function that takes another's fails mypy.

Like tests/test_node_keys.py, this spells the words: a change to one is a change every user's alerts,
scripts and admission policy see, so it must be a deliberate edit here too.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
from enum import Enum
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

import agent
from agent.core.history_annotation import HistoryAction, HistoryActor, HistoryMark, HistoryTaint
from agent.core.metric_labels import (
    ActiveCheckAbort,
    ActiveCheckState,
    ConfigReloadResult,
    DeviceTaintFallback,
    DriverTaintEffect,
    DriverTaintKey,
    GpuSource,
    ToolOutcome,
)
from agent.core.node_keys import ConditionReason, EventReason
from agent.core.record_kind import RecordKind
from agent.core.remediation_types import RemediationReason
from agent.core.repair_budget import HoldReason
from agent.core.vocabulary import Vocabulary

ROOT = Path(__file__).resolve().parent.parent

# What the agent writes today, by vocabulary: {name: word}.
WIRE: dict[type[Vocabulary], dict[str, str]] = {
    EventReason: {
        "GPU_HEALTH_CHANGED": "GPUHealthChanged",
        "LATCHED_FINDING": "LatchedFinding",
        "LATCHES_CLEARED": "LatchesCleared",
        "TAINT_ADDED": "TaintAdded",
        "TAINT_REMOVED": "TaintRemoved",
        "TAINT_RESTORED": "TaintRestored",
        "TAINT_OPTED_OUT": "TaintDisabled",
        "BRAKE_OPEN": "BrakeOpen",
        "BRAKE_CLOSED": "BrakeClosed",
        "CONFIG_RELOADED": "ConfigReloaded",
        "CONFIG_REJECTED": "ConfigRejected",
        "CONFIG_RESTART_REQUIRED": "ConfigRestartRequired",
        "NODE_WRITE_REFUSED": "NodeWriteRefused",
        "REMEDIATION_HELD": "RemediationHeld",
        "VALIDATION_STARTED": "ValidationStarted",
        "VALIDATION_PASSED": "ValidationPassed",
        "VALIDATION_DRIVER_TIMEOUT": "ValidationDriverTimeout",
        "ACTIVE_CHECK_STARTED": "ActiveCheckStarted",
        "ACTIVE_CHECK_ABORTED": "ActiveCheckAborted",
        "GPU_STALLED": "GPUStalled",
        "DEVICE_TAINTS_UNAVAILABLE": "DeviceTaintsUnavailable",
        "GPU_ISOLATED": "GPUIsolated",
        "GPU_RETURNED": "GPUReturned",
    },
    ConditionReason: {
        "ALL_CHECKS_PASSED": "AllChecksPassed",
        "CHECKS_WARN": "ChecksWarn",
        "CHECKS_FAILED": "ChecksFailed",
        "CHECKS_UNKNOWN": "CouldNotCheck",
        "GPUS_ISOLATED": "GPUsIsolated",
        "CONFIG_REJECTED": "ConfigRejected",
    },
    RemediationReason: {
        "FAILED": "GPUHealthcheckFailed",
        "RECOVERING": "GPUHealthcheckRecovering",
        "PASSED": "GPUHealthcheckPassed",
        "BELOW_MIN_SEVERITY": "GPUHealthcheckBelowMinSeverity",
        "COULD_NOT_CHECK": "GPUHealthcheckCouldNotCheck",
        "BRAKE_HELD": "GPUHealthcheckBrakeHeld",
        "TAINT_DISABLED": "GPUHealthcheckTaintDisabled",
        "NOT_ENFORCED": "GPUHealthcheckNotEnforced",
        "BUDGET_HELD": "GPUHealthcheckBudgetHeld",
        "WAVE_HELD": "GPUHealthcheckWaveHeld",
    },
    HoldReason: {"BUDGET": "budget", "WAVE": "wave"},
    RecordKind: {
        "FAIL": "fail",
        "MARK": "mark",
        "RELEASE": "release",
        "WAVE": "wave",
        "TAINT": "taint",
        "SLOT": "slot",
    },
    HistoryTaint: {"ON": "on", "HELD": "held", "DISABLED": "disabled", "OFF": ""},
    HistoryMark: {"MARK_ON": "on", "HELD_BY_BUDGET": "budget", "HELD_BY_WAVE": "wave", "MARK_OFF": ""},
    HistoryAction: {
        "TAINT": "taint",
        "UNTAINT": "untaint",
        "TAINT_HELD_BY_BRAKE": "brake-held",
        "TAINT_OFF_BY_LABEL": "taint-disabled",
        "MARK": "mark",
        "UNMARK": "unmark",
        "MARK_HELD_BY_BUDGET": "budget-held",
        "MARK_HELD_BY_WAVE": "wave-held",
        "CLEAR": "clear",
        "CLEAR_KEPT": "clear-kept",
        "OPERATOR_DIAG": "diag",
        "REBOOT": "reboot",
    },
    HistoryActor: {
        "AGENT": "agent",
        "BRAKE": "brake",
        "REPAIR_BUDGET": "repair budget",
        "WAVE_HOLD": "wave hold",
        "LABEL": "label",
    },
    ConfigReloadResult: {
        "APPLIED": "applied",
        "RESTART_REQUIRED": "restart_required",
        "REJECTED": "rejected",
    },
    ToolOutcome: {"READ_OK": "ok", "READ_FAILED": "failed", "READ_TIMEOUT": "timeout"},
    GpuSource: {
        "NVML": "nvml",
        "NVIDIA_SMI": "nvidia-smi",
        "DCGM": "dcgm",
        "DRA": "dra",
        "ALLOCATABLE": "allocatable",
    },
    DeviceTaintFallback: {
        "API_UNAVAILABLE": "unavailable",
        "RULE_REFUSED": "refused",
        "RULE_FAILED": "failed",
        "RULE_UNANSWERED": "unanswered",
        "RULE_NOT_COUNTED": "not-counted",
    },
    ActiveCheckState: {
        "IDLE": "idle",
        "WAITING": "waiting",
        "NO_SLOT": "no-slot",
        "HOLDING": "holding",
        "RUNNING": "running",
    },
    ActiveCheckAbort: {
        "POD_ARRIVED": "pod-arrived",
        "GPU_HELD": "gpu-held",
        "KUBELET_UNREADABLE": "kubelet-unreadable",
        "UNFINISHED": "unfinished",
    },
    DriverTaintKey: {
        "DRIVER_XID": "gpu.nvidia.com/xid",
        "DRIVER_GPU_LOST": "gpu.nvidia.com/gpu-lost",
        "DRIVER_UNMONITORED": "gpu.nvidia.com/unmonitored",
        "DRIVER_OTHER_KEY": "other",
    },
    DriverTaintEffect: {
        "EFFECT_NONE": "None",
        "EFFECT_NO_SCHEDULE": "NoSchedule",
        "EFFECT_NO_EXECUTE": "NoExecute",
        "EFFECT_OTHER": "other",
    },
}
# The words in two vocabularies, by design: the condition says ConfigRejected while its Event does;
# a record kind is the word of what it records (a mark, a taint, a wave: history's and a hold's).
SHARED = {"CONFIG_REJECTED", "MARK", "TAINT", "WAVE"}


def agent_modules() -> list[object]:
    names = [m.name for m in pkgutil.walk_packages(agent.__path__, "agent.")]
    return [importlib.import_module(n) for n in names if not n.endswith("__main__")]


def vocabularies() -> set[type[Vocabulary]]:
    """Every Vocabulary in agent/ (all its modules imported), so that a new one is held here too."""
    agent_modules()
    return set(Vocabulary.__subclasses__())


def test_every_vocabulary_is_spelled_here() -> None:
    assert vocabularies() == set(WIRE)


@pytest.mark.parametrize("vocab", list(WIRE), ids=lambda v: v.__name__)
def test_each_vocabulary_writes_todays_words_each_once(vocab: type[Vocabulary]) -> None:
    assert {m.name: m.value for m in vocab} == WIRE[vocab]
    assert len(vocab.__members__) == len(vocab) == len({m.value for m in vocab})  # no alias


@pytest.mark.parametrize("vocab", list(WIRE), ids=lambda v: v.__name__)
def test_a_word_is_its_value_wherever_it_is_written(vocab: type[Vocabulary]) -> None:
    """JSON (annotations, Events, conditions), f-strings and str() (messages, logs `%s`, CEL), Prometheus
    labels: the value, never `Vocab.NAME`."""
    for m in vocab:
        assert (str(m), f"{m}", json.dumps(m), m == m.value) == (
            m.value,
            m.value,
            json.dumps(m.value),
            True,
        )
        assert type(str(m)) is str
    registry = CollectorRegistry()
    counter = Counter("vocab_total", "one per word", ["word"], registry=registry)
    words = [m for m in vocab if m.value]
    for m in words:
        counter.labels(m).inc()
    text = generate_latest(registry).decode()
    assert all(f'vocab_total{{word="{m.value}"}} 1.0' in text for m in words), text


def test_no_name_means_two_things() -> None:
    """A name in two vocabularies is the same word in both; and no module-level constant of agent/
    borrows a vocabulary's name for another word."""
    seen: dict[str, tuple[type[Vocabulary], str]] = {}
    shared = set()
    for vocab in WIRE:
        for m in vocab:
            if m.name in seen:
                other, word = seen[m.name]
                assert word == m.value, f"{vocab.__name__}.{m.name} vs {other.__name__}.{m.name}"
                shared.add(m.name)
            seen[m.name] = (vocab, m.value)
    assert shared == SHARED
    for module in agent_modules():
        for name, value in vars(module).items():
            if name in seen and isinstance(value, str) and not isinstance(value, Enum):
                assert value == seen[name][1], f"{module.__name__}.{name} = {value!r} vs {seen[name]}"  # type: ignore[attr-defined]


def test_the_old_homonyms_are_gone() -> None:
    """BUDGET_HELD, WAVE_HELD, BRAKE_HELD and TAINT_DISABLED each name one thing: a remediation reason."""
    homonyms = {"BUDGET_HELD", "WAVE_HELD", "BRAKE_HELD", "TAINT_DISABLED"}
    owners = {(v.__name__, m.name) for v in WIRE for m in v if m.name in homonyms}
    assert owners == {("RemediationReason", n) for n in homonyms}
    for module in agent_modules():
        assert not homonyms & set(vars(module)), module


# Each `# wrong` line hands one vocabulary's word where another's (or a bare str) is taken; the
# other lines are the right uses, so a mypy that fails for another reason fails this test too.
SNIPPET = """\
from agent.core.history_annotation import HistoryMark, HistoryTaint
from agent.core.marks import NodeEvent
from agent.core.active_checks import Abort
from agent.core.metric_labels import ActiveCheckAbort, ActiveCheckState, ConfigReloadResult, ToolOutcome
from agent.core.node_keys import Condition, ConditionReason, EventReason
from agent.core.remediation_reasons import FaultReason
from agent.core.remediation_types import RemediationMark, RemediationReason
from agent.core.repair_budget import Hold, HoldReason
from agent.core.telemetry import NoTelemetry

t = NoTelemetry()
NodeEvent(EventReason.TAINT_OPTED_OUT, "m")
NodeEvent(RemediationReason.TAINT_DISABLED, "m")  # wrong
NodeEvent(ConditionReason.CONFIG_REJECTED, "m")  # wrong
NodeEvent("TaintDisabled", "m")  # wrong
Condition("False", ConditionReason.CHECKS_FAILED)
Condition("False", EventReason.CONFIG_REJECTED)  # wrong
RemediationMark("T", "False", True, RemediationReason.BRAKE_HELD, "m")
RemediationMark("T", "False", True, FaultReason("GPUHealthcheckXidReboot"), "m")
RemediationMark("T", "False", True, ConditionReason.CHECKS_FAILED, "m")  # wrong
Hold(HoldReason.BUDGET, "xid/79", "m")
Hold(HistoryMark.HELD_BY_BUDGET, "xid/79", "m")  # wrong
Hold("budget", "xid/79", "m")  # wrong
t.record_remediation_held(HoldReason.WAVE, "xid/79")
t.record_remediation_held(HistoryMark.HELD_BY_WAVE, "xid/79")  # wrong
t.record_config_reload(ConfigReloadResult.APPLIED)
t.record_config_reload(ToolOutcome.READ_OK)  # wrong
t.record_tool_read("nvml", ToolOutcome.READ_FAILED, 0.1)
t.record_tool_read("nvml", HistoryTaint.ON, 0.1)  # wrong
t.record_active_check(ActiveCheckState.NO_SLOT)
t.record_active_check(ActiveCheckAbort.UNFINISHED)  # wrong
t.record_active_check("idle")  # wrong
t.record_active_check_abort(ActiveCheckAbort.GPU_HELD)
t.record_active_check_abort(ActiveCheckState.WAITING)  # wrong
Abort(ActiveCheckAbort.POD_ARRIVED, "pod team-a/train-0 arrived")
Abort("pod-arrived", "pod team-a/train-0 arrived")  # wrong
"""


def test_a_word_of_the_wrong_vocabulary_fails_mypy(tmp_path: Path) -> None:
    snippet = tmp_path / "wrong_vocabulary.py"
    snippet.write_text(SNIPPET)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--no-error-summary",
            str(snippet),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    wrong = {i for i, line in enumerate(SNIPPET.splitlines(), 1) if line.endswith("# wrong")}
    flagged = {
        int(line.split(":")[1])
        for line in run.stdout.splitlines()
        if line.startswith(str(snippet)) and ": error: " in line
    }
    assert run.returncode == 1 and flagged == wrong, run.stdout + run.stderr
    assert all("[arg-type]" in line for line in run.stdout.splitlines() if ": error: " in line), run.stdout
