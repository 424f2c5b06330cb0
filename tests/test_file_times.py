"""The record of each test file's duration that orders the next run (tests/kubeenv/file_times.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.kubeenv import file_times


def report(nodeid: str, seconds: float) -> Any:
    return SimpleNamespace(nodeid=nodeid, duration=seconds)


def test_a_run_adds_up_its_files_and_keeps_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / ".cache" / "test-file-seconds.json"
    record.parent.mkdir()
    record.write_text('{"tests/test_old.py": 9.5, "tests/test_a.py": 1.0}')
    monkeypatch.setattr(file_times, "_SECONDS", file_times.defaultdict(float))
    for phase in (0.25, 2.0, 0.25):  # setup, call, teardown
        file_times.record_report(report("tests/test_a.py::test_one", phase))
    file_times.record_report(report("tests/test_a.py::Class::test_two[x]", 1.5))
    file_times.record_report(report("tests/test_b.py::test_one", 0.5))
    file_times.save(record)
    assert file_times.load(record) == {
        "tests/test_a.py": 4.0,
        "tests/test_b.py": 0.5,
        "tests/test_old.py": 9.5,
    }
    assert not list(record.parent.glob(".test-file-seconds.json.*"))  # the temp file was renamed


@pytest.mark.parametrize("text", ["", "not json", "[1, 2]", '{"tests/test_a.py": "slow"}'])
def test_an_unreadable_record_orders_nothing(tmp_path: Path, text: str) -> None:
    record = tmp_path / "test-file-seconds.json"
    record.write_text(text)
    assert file_times.load(record) == {}
    assert file_times.load(tmp_path / "missing.json") == {}


def test_a_run_that_ran_nothing_leaves_the_record_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "test-file-seconds.json"
    record.write_text('{"tests/test_old.py": 9.5}')
    monkeypatch.setattr(file_times, "_SECONDS", file_times.defaultdict(float))
    file_times.save(record)
    assert record.read_text() == '{"tests/test_old.py": 9.5}'
