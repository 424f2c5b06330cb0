"""The loop's write policy (also what bench/fleet.py simulates): back off, then ask the brake again."""

from __future__ import annotations

from dataclasses import dataclass

from agent.config import parse_config
from agent.engine.write_policy import WritePolicy, brake_reask_s


@dataclass(frozen=True)
class Outcome:
    ok: bool
    brake_open: bool = False
    error: str | None = None
    remediation_held: str = ""
    held_key: str = ""


def test_failed_writes_back_off_1_2_4_up_to_30_s_and_a_success_resets_it() -> None:
    policy = WritePolicy(lambda: 30.0)
    waits = [policy.next_try(Outcome(ok=False, error="API error 503")) for _ in range(7)]
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert policy.next_try(Outcome(ok=True)) is None  # written: nothing to retry
    assert policy.next_try(Outcome(ok=False)) == 1.0  # the backoff starts over


def test_only_a_failed_write_holds_the_next_one_back_and_a_braked_one_does_not() -> None:
    """The loop writes nothing while `failing` and the stated wait is not over (a refusal, an
    unreachable API server); a brake or repair hold re-asks but never holds a changed verdict back."""
    policy = WritePolicy(lambda: 30.0)
    assert not policy.failing
    policy.next_try(Outcome(ok=False, error="API error 403"))
    assert policy.failing
    policy.next_try(Outcome(ok=True, brake_open=True))
    assert not policy.failing


def test_a_braked_write_is_asked_again_after_min_30_s_and_the_gpu_interval() -> None:
    cfg = parse_config({"intervals": {"gpu": 10}})
    assert WritePolicy(lambda: brake_reask_s(cfg)).next_try(Outcome(ok=True, brake_open=True)) == 10.0
    slow = parse_config({"intervals": {"gpu": 600}})
    assert WritePolicy(lambda: brake_reask_s(slow)).next_try(Outcome(ok=True, brake_open=True)) == 30.0


def test_a_held_remediation_mark_is_asked_again_like_a_braked_taint() -> None:
    cfg = parse_config({"intervals": {"gpu": 10}})
    policy = WritePolicy(lambda: brake_reask_s(cfg))
    assert policy.next_try(Outcome(ok=True, remediation_held="wave", held_key="xid/79")) == 10.0
    assert policy.next_try(Outcome(ok=True)) is None  # marked (or no wish): nothing to ask again
