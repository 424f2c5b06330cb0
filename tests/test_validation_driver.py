"""Validate before service on a DRA-only node (issue 45 item 3), without an API server: the validating
taint waits for NVIDIA's DRA driver to publish the GPUs (engine/driver_wait.py). The engine runs on the
healthy DRA-only snapshot (examples/snapshots/p5.48xlarge-dra: no nvidia.com/gpu, the driver's slice
of 8) with its Node carrying the taint, and a variant of its slice per case: none yet, 7 of 8. The
DeviceClass reader is the one seam (the real one on the real API server:
tests/test_validation_driver_kube.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from agent.core.node_keys import EventReason, Keys
from agent.core.results_doc import VALIDATED_FIELD, VALIDATING_FIELD
from agent.core.severity import Status
from agent.engine.driver_wait import DRA_DRIVER, RETRY_S
from agent.engine.engine import Engine
from tests.test_engine import engine_for
from tests.test_validation import run_every_tier
from tests.test_validation import snapshot as plugin_snapshot

ROOT = Path(__file__).resolve().parent.parent
DRA = ROOT / "examples" / "snapshots" / "p5.48xlarge-dra"
KEY = Keys().validating
SLICES = "resourceslices.json"
WAITING = "waiting for NVIDIA's DRA driver to publish the GPUs"


def dra_snapshot(tmp_path: Path, devices: list[str] | None = None) -> Path:
    """The DRA-only snapshot with the validating taint on its Node; *devices*: the slice's devices
    kept (None: all 8; []: no slice at all, the driver not started)."""
    dest = tmp_path / "snap"
    shutil.copytree(DRA, dest, symlinks=True)
    node = json.loads((dest / "node.json").read_text())
    node["spec"] = {"taints": [{"key": KEY, "effect": "NoSchedule"}]}
    (dest / "node.json").write_text(json.dumps(node))
    if devices is not None:
        publish(dest, devices)
    return dest


def publish(snap: Path, devices: list[str] | None) -> None:
    """The driver (re)publishes this node's slice with *devices* (None: all 8 as recorded)."""
    doc = json.loads((DRA / SLICES).read_text())
    if devices is not None:
        if not devices:
            doc["items"] = []
        for item in doc["items"]:
            item["spec"]["devices"] = [d for d in item["spec"]["devices"] if d["name"] in devices]
    (snap / SLICES).write_text(json.dumps(doc))


class Reader:
    """The DeviceClass gpu.nvidia.com as the API server answers (True, False: 404, or why not)."""

    def __init__(self, answer: bool | str = True) -> None:
        self.answer, self.calls = answer, 0

    def __call__(self) -> bool | str:
        self.calls += 1
        return self.answer


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def engine(snap: Path, reader: Reader | None, clock: Clock | None = None, **validate: Any) -> Engine:
    eng = engine_for(snap, node={"validate": validate}) if validate else engine_for(snap)
    eng.validation.driver.read = reader
    eng.wall = clock or Clock()
    return eng


def validating_doc(marks: Any) -> dict[str, Any]:
    return dict(json.loads(marks.results_json).get(VALIDATING_FIELD) or {})


def every_gpu_but(n: int) -> list[str]:
    return [f"gpu-{i}" for i in range(8) if i != n]


def test_a_healthy_dra_only_node_whose_driver_published_every_gpu_lifts_asking_the_class_once(
    tmp_path: Path,
) -> None:
    reader = Reader(True)
    eng = engine(dra_snapshot(tmp_path), reader)
    run_every_tier(eng)
    verdict, marks = eng.evaluate()
    assert verdict.status is Status.PASS and marks.validating is False
    assert EventReason.VALIDATION_PASSED in [e.reason for e in marks.events]
    eng.run_tier("gpu")
    eng.evaluate()
    assert reader.calls == 1  # once per validation, none once validated


def test_nothing_published_yet_keeps_the_taint_and_says_so_until_the_driver_publishes(tmp_path: Path) -> None:
    snap = dra_snapshot(tmp_path, devices=[])
    eng = engine(snap, Reader(True))
    run_every_tier(eng)
    verdict, marks = eng.evaluate()
    assert verdict.status is Status.PASS  # gpu.allocatable is skipped: nothing publishes, no fault
    assert marks.validating is None  # ... but the pass waits for the driver
    said = validating_doc(marks)
    assert said["waitingFor"] == [DRA_DRIVER]
    assert said["driver"].startswith(f"{WAITING} (0 of 8 published; not GPU 0 (0000:53:00.0), GPU 1")
    assert f"validating: {WAITING} (0 of 8 published" in marks.condition_message
    assert VALIDATED_FIELD not in json.loads(marks.results_json)
    # The driver's kubelet plugin starts and publishes all 8: the next gpu run lifts the taint.
    publish(snap, None)
    eng.run_tier("gpu")
    _, marks = eng.evaluate()
    assert marks.validating is False
    assert VALIDATING_FIELD not in json.loads(marks.results_json)


def test_seven_of_eight_published_keeps_the_taint_naming_the_missing_gpu(tmp_path: Path) -> None:
    snap = dra_snapshot(tmp_path, devices=every_gpu_but(3))
    eng = engine(snap, Reader(True))
    run_every_tier(eng)
    verdict, marks = eng.evaluate()
    assert verdict.status is Status.WARN and marks.validating is None  # gpu.allocatable warns, as before
    said = validating_doc(marks)
    assert said["driver"] == f"{WAITING} (7 of 8 published; not GPU 3 (0000:86:00.0))"
    assert said["waitingFor"] == [DRA_DRIVER]
    # requireAllPublished false: the driver has published, the missing GPU is gpu.allocatable's warn
    eng = engine(snap, Reader(True), requireAllPublished=False)
    run_every_tier(eng)
    verdict, marks = eng.evaluate()
    assert verdict.status is Status.WARN and marks.validating is False


def test_past_the_timeout_the_taint_stays_with_its_reason_and_one_event(tmp_path: Path) -> None:
    snap = dra_snapshot(tmp_path, devices=every_gpu_but(3))
    clock = Clock()
    eng = engine(snap, Reader(True), clock, driverTimeoutSeconds=120)
    run_every_tier(eng)
    _, marks = eng.evaluate()  # the taint seen: the wait is counted from here
    assert not [e for e in marks.events if e.reason == EventReason.VALIDATION_DRIVER_TIMEOUT]
    clock.now += 121
    eng.run_tier("gpu")
    _, marks = eng.evaluate()
    (event,) = [e for e in marks.events if e.reason == EventReason.VALIDATION_DRIVER_TIMEOUT]
    assert event.type == "Warning"
    assert event.message.startswith(
        "NVIDIA's DRA driver has not published this node's GPUs within 120 s "
        "(node.validate.driverTimeoutSeconds): 7 of 8 published; not GPU 3 (0000:86:00.0); "
        f"the taint {KEY} stays until it does"
    )
    assert marks.validating is None
    said = validating_doc(marks)
    assert said["driver"] == event.message and said["driverTimedOut"] is True
    assert said["waitingFor"] == [DRA_DRIVER]
    assert "(past node.validate.driverTimeoutSeconds 120 s)" in marks.condition_message
    clock.now += 60
    eng.run_tier("gpu")
    _, later = eng.evaluate()
    assert later.validating is None
    assert validating_doc(later) == said  # nothing that changes each cycle: no write per cycle
    marks = later
    assert not [e for e in marks.events if e.reason == EventReason.VALIDATION_DRIVER_TIMEOUT]  # once
    # An agent restarted in the same boot takes the wait back and says nothing again.
    again = engine(snap, Reader(True), clock, driverTimeoutSeconds=120)
    again.restore(json.loads(marks.results_json))
    run_every_tier(again)
    _, restarted = again.evaluate()
    assert restarted.validating is None and validating_doc(restarted)["driverTimedOut"] is True
    assert not [e for e in restarted.events if e.reason == EventReason.VALIDATION_DRIVER_TIMEOUT]
    # A late publication still lifts it.
    publish(snap, None)
    eng.run_tier("gpu")
    _, marks = eng.evaluate()
    assert marks.validating is False


def test_a_device_plugin_node_is_unaffected_and_asks_nothing(tmp_path: Path) -> None:
    reader = Reader(True)
    eng = engine(plugin_snapshot(tmp_path), reader)  # nvidia.com/gpu 8, no slices
    run_every_tier(eng)
    _, marks = eng.evaluate()
    assert marks.validating is False and reader.calls == 0
    assert "driver" not in validating_doc(marks)


def test_without_the_drivers_device_class_or_with_never_nothing_is_waited_for(tmp_path: Path) -> None:
    snap = dra_snapshot(tmp_path, devices=[])
    for reader, validate in ((Reader(False), {}), (Reader(True), {"waitForDriver": "never"}), (None, {})):
        eng = engine(snap, reader, **validate)
        run_every_tier(eng)
        _, marks = eng.evaluate()
        assert marks.validating is False, (reader, validate)
    # always: waits without asking the API server
    reader = Reader(False)
    eng = engine(snap, reader, waitForDriver="always")
    run_every_tier(eng)
    _, marks = eng.evaluate()
    assert marks.validating is None and reader.calls == 0
    assert validating_doc(marks)["driver"].startswith(f"{WAITING} (0 of 8 published")


def test_a_device_class_that_cannot_be_read_keeps_the_wait_and_is_asked_again_later(tmp_path: Path) -> None:
    reader, clock = Reader("could not read DeviceClass gpu.nvidia.com: API error 403 Forbidden"), Clock()
    eng = engine(dra_snapshot(tmp_path), reader, clock)  # every GPU published, but is the driver here?
    run_every_tier(eng)
    _, marks = eng.evaluate()
    assert marks.validating is None
    assert validating_doc(marks)["driver"] == (
        f"{WAITING} (cannot tell whether it runs here: could not read DeviceClass gpu.nvidia.com: "
        "API error 403 Forbidden)"
    )
    eng.evaluate()
    assert reader.calls == 1  # not per verdict
    clock.now += RETRY_S
    reader.answer = True
    _, marks = eng.evaluate()
    assert reader.calls == 2 and marks.validating is False


def test_status_says_what_the_driver_wait_still_needs() -> None:
    """`gpu-healthcheck status`'s WAITING FOR VALIDATION line names the GPUs the driver has not
    published, as the results annotation says, not just "dra-driver"."""
    from datetime import datetime, timezone

    from agent.cli.status_validating import validating
    from agent.core.node_keys import Keys

    keys = Keys()
    said = "NVIDIA's DRA driver to publish the GPUs (7 of 8 published; not GPU 3 (0000:86:00.0))"
    node = {"metadata": {"name": "n"}, "spec": {"taints": [{"key": keys.validating, "effect": "NoSchedule"}]}}
    results = {
        "validating": {"since": "2026-11-29T00:00:00Z", "waitingFor": ["dra-driver", "gpu"], "driver": said}
    }
    v = validating(node, results, keys, datetime(2026, 11, 29, 0, 1, tzinfo=timezone.utc))
    assert v is not None and v["waitingFor"] == [said, "gpu"] and v["seconds"] == 60
