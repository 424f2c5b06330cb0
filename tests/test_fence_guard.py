"""The agent's side of the fence (issue 28 item 1), without an API server: the guard that holds
every Node write of an identity marked to be fenced that the fence does not hold, the reload that
adopts a config only when the fence allows its condition types, and the start that falls back when
it refuses them. The same code against the real API server: tests/test_fence_blast_radius.py and
tests/test_remediation_kube.py."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import agent.config.watch as watch
from agent.config import Config, load_config_dir
from agent.config.fence_view import condition_types
from agent.config.last_good import load_at_start, save_last_good
from agent.config.watch import ConfigWatcher
from agent.reporters.fence import FenceProof, FenceResult
from agent.reporters.fence_guard import FenceGuard, GuardedWriter

ROOT = Path(__file__).parent.parent
AHR = "AcceleratedHardwareReady"
WITH_AHR = f"node:\n  remediationConditions:\n    - type: {AHR}\n"
FENCED = FenceProof(FenceResult.FENCED, "refused")
HALF = FenceProof(FenceResult.UNFENCED, "the API server would accept it", marked=True)
UNMARKED = FenceProof(FenceResult.UNFENCED, "the API server would accept it", marked=False)


class Writer:
    def __init__(self) -> None:
        self.applied: list[Any] = []

    def apply(self, marks: Any) -> Any:
        self.applied.append(marks)
        return "written"


def guarded(answers: list[FenceProof], **kw: Any) -> tuple[GuardedWriter, Writer, list[FenceProof]]:
    reported: list[FenceProof] = []
    guard = FenceGuard(lambda: answers.pop(0) if len(answers) > 1 else answers[0], reported.append, **kw)
    writer = Writer()
    return GuardedWriter(writer, guard), writer, reported


def test_a_marked_identity_the_fence_does_not_hold_writes_nothing_until_it_does() -> None:
    out, writer, reported = guarded([HALF, HALF, FENCED], reprove_s=0)
    out.guard.start().join()
    held = out.apply("marks")
    assert not held.ok and "fail closed" in held.error and writer.applied == []
    assert out.apply("marks") == "written"  # asked again while holding: the fence is back
    assert writer.applied == ["marks"] and reported == [HALF, FENCED]  # each new answer, once


def test_it_asks_again_at_most_every_reprove_s_while_holding() -> None:
    answers = [HALF, FENCED]
    out, writer, _ = guarded(answers, reprove_s=3600)
    out.guard.start().join()
    assert not out.apply("marks").ok and not out.apply("marks").ok
    assert answers == [FENCED] and writer.applied == []  # not asked again within reprove_s


@pytest.mark.parametrize("proof", [FENCED, UNMARKED, FenceProof(FenceResult.UNKNOWN, "no other Node")])
def test_anything_but_half_an_install_writes(proof: FenceProof) -> None:
    """An identity RBAC does not mark (an admin kubeconfig, an install without the mark) is only
    alerted about; one the proof cannot judge writes as before."""
    out, _, _ = guarded([proof])
    out.guard.start().join()
    assert out.apply("marks") == "written"


def test_no_write_before_the_first_proof_answers() -> None:
    out, writer, _ = guarded([FENCED], wait_s=0.01)  # never started
    held = out.apply("marks")
    assert not held.ok and "has not answered yet" in held.error and writer.applied == []


# ------------------------------------------------------------------------------------------ config


def refusing(*types: str) -> tuple[Any, list[list[str]]]:
    """A vet that refuses a config writing any of *types*, and the lists it was asked about."""
    asked: list[list[str]] = []

    def vet(cfg: Config) -> str | None:
        asked.append(condition_types(cfg.node))
        bad = [t for t in condition_types(cfg.node) if t in types]
        return f"the admission fence refuses {bad}" if bad else None

    return vet, asked


def test_a_reload_the_fence_refuses_is_rejected_and_adopted_once_it_allows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "config.yaml").write_text("intervals:\n  gpu: 30\n")
    cfg = load_config_dir(tmp_path)
    vet, asked = refusing(AHR)
    watcher = ConfigWatcher(tmp_path, cfg, vet=vet, state_dir=tmp_path / "state")
    time.sleep(0.01)
    (tmp_path / "config.yaml").write_text("intervals:\n  gpu: 30\n" + WITH_AHR)
    out = watcher.poll()
    assert out is not None and out.config is None and f"refuses ['{AHR}']" in str(out.error)
    assert watcher.current is cfg and not (tmp_path / "state").exists()  # not kept as last good
    assert watcher.poll() is None  # unchanged, and not due again: nothing said twice
    monkeypatch.setattr(watch, "REVET_S", 0.0)
    assert watcher.poll() is None and asked[-1] == ["GPUHealthy", AHR]  # asked again, still refused
    vet_ok, _ = refusing()
    watcher.vet = vet_ok  # the policy updated after the ConfigMap
    out = watcher.poll()
    assert out is not None and out.config is not None and "node.remediationConditions" in out.changed
    assert watcher.poll() is None  # adopted: no more asking


def test_an_invalid_config_is_not_asked_about_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config_dir(ROOT / "config")
    vet, asked = refusing()
    monkeypatch.setattr(watch, "REVET_S", 0.0)
    watcher = ConfigWatcher(tmp_path, cfg, vet=vet)
    (tmp_path / "config.yaml").write_text("nonsense: 1\n")
    out = watcher.poll()
    assert out is not None and out.config is None and "nonsense" in str(out.error)
    assert watcher.poll() is None and asked == []


def test_at_start_a_refused_config_falls_back_to_the_last_good_one_the_fence_allows(tmp_path: Path) -> None:
    mounted, state = tmp_path / "mounted", tmp_path / "state"
    mounted.mkdir()
    (mounted / "config.yaml").write_text("intervals:\n  gpu: 45\n")
    save_last_good(mounted, state)
    (mounted / "config.yaml").write_text(WITH_AHR)
    vet, _ = refusing(AHR)
    start = load_at_start(mounted, state, None, vet)
    assert start.fence_refused and start.config.intervals.gpu == 45
    assert "refuses" in start.problem and "last good" in start.problem

    # no last good copy: the shipped defaults, whose only type the fence allows
    start = load_at_start(mounted, tmp_path / "empty", None, vet)
    assert start.fence_refused and condition_types(start.config.node) == ["GPUHealthy"]
    assert start.problem.startswith("running on the shipped default configuration: ")

    # a fence that refuses even those: the agent runs on them, and says so
    vet_all, _ = refusing(AHR, "GPUHealthy")
    start = load_at_start(mounted, tmp_path / "empty", None, vet_all)
    assert "which the fence refuses too" in start.problem

    # allowed: adopted and kept as the last good one
    vet_ok, _ = refusing()
    start = load_at_start(mounted, state, None, vet_ok)
    assert not start.fence_refused and start.problem == "" and start.config.node.remediation_conditions
    assert (state / "last-good-config" / "config.yaml").read_text() == WITH_AHR
