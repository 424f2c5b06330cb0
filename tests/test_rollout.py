"""A rollout an SRE can stage (issue 28 item 5), without an API server: the canary choice and its
watcher, what mode taint would do in the results annotation, and the status table's WOULD and CONFIG
columns and summary. The agent and a real Node: tests/test_canary_kube.py."""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from agent.cli.status import HEADER, WIDE_HEADER, render, status_list, status_rows
from agent.config import CONFIG_FILES, load_config_dir, parse_config, yaml_safe
from agent.config.canary import CANARY, MAIN, Choice, choose, files_digest, has_config, short
from agent.config.last_good import load_at_start
from agent.config.watch import ConfigWatcher
from agent.core.node_keys import Keys
from agent.core.remediation_types import RemediationReason
from agent.core.results_doc import CONFIG_FIELD, WOULD_FIELD
from agent.core.severity import Severity
from agent.engine.engine import Engine
from agent.engine.recovery import Recovery
from agent.engine.rollout import MARK_MAX, would_document
from agent.probes.snapshot import SnapshotSource

ROOT = Path(__file__).parent.parent
HEALTHY = ROOT / "examples" / "snapshots" / "p5.48xlarge-healthy"
XID79 = ROOT / "examples" / "snapshots" / "p5.48xlarge-xid79"
K = Keys()
NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
AHR = "AcceleratedHardwareReady"


# ----------------------------------------------------------------------------- the canary choice


def test_the_canary_is_chosen_only_when_asked_and_present(tmp_path: Path) -> None:
    main, canary = tmp_path / "main", tmp_path / "canary"
    main.mkdir()
    canary.mkdir()  # the optional ConfigMap volume while the ConfigMap does not exist: empty
    at_main = Choice(MAIN, main)
    assert not has_config(canary) and not has_config(None)
    assert choose(main, canary, True, at_main) == at_main  # asked, but no canary ConfigMap
    (canary / "xid-catalog.yaml").write_text((ROOT / "config" / "xid-catalog.yaml").read_text())
    assert has_config(canary)  # any of the config files makes a config
    assert choose(main, canary, True, at_main) == Choice(CANARY, canary)
    assert choose(main, canary, False, Choice(CANARY, canary)) == at_main
    assert choose(main, canary, None, Choice(CANARY, canary)) == Choice(CANARY, canary)  # Node unseen
    assert choose(main, None, True, at_main) == at_main  # no canary directory mounted


def test_the_digest_follows_the_files_not_the_directory(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "config.yaml").write_text("node:\n  mode: observe\n")
    assert files_digest(a) == files_digest(b) and len(short(files_digest(a))) == 12
    (b / "config.yaml").write_text("node:\n  mode: label\n")
    assert files_digest(a) != files_digest(b)
    assert files_digest(None) != files_digest(a)  # the shipped files


def test_the_watcher_switches_to_the_canary_and_back(tmp_path: Path) -> None:
    main, canary = tmp_path / "main", tmp_path / "canary"
    main.mkdir()
    canary.mkdir()
    (main / "config.yaml").write_text("node:\n  mode: taint\n")
    start = load_at_start(main, tmp_path / "state", None)
    assert (start.config.source, start.config.digest) == (MAIN, short(files_digest(main)))
    label: list[bool | None] = [None]
    watcher = ConfigWatcher(main, start.config, canary_dir=canary, wants_canary=lambda: label[0])

    assert watcher.poll() is None  # the Node not seen yet: the main one stays
    label[0] = True
    assert watcher.poll() is None  # labelled, but the canary ConfigMap does not exist

    (canary / "config.yaml").write_text("node:\n  mode: observe\n")
    out = watcher.poll()
    assert out is not None and out.config is not None and out.switched
    assert (out.source.source, out.previous.source) == (CANARY, MAIN)
    assert out.config.node.mode == "observe" and out.config.source == CANARY
    assert out.config.digest == short(files_digest(canary)) and out.changed == ("node.mode",)
    assert watcher.poll() is None  # steady: nothing to do

    (canary / "config.yaml").write_text("node:\n  mode: sometimes\n")  # an invalid canary edit
    bad = watcher.poll()
    assert bad is not None and bad.config is None and "node.mode" in (bad.error or "")
    assert bad.source.source == CANARY and bad.previous.source == CANARY  # the canary's last good stays
    assert watcher.current.node.mode == "observe" and watcher.poll() is None

    label[0] = False  # the label removed: back to the main one, although it did not change
    back = watcher.poll()
    assert back is not None and back.config is not None and back.switched
    assert back.config.source == MAIN and back.config.node.mode == "taint"

    label[0] = True  # labelled again while the canary is invalid: rejected, the main one stays
    again = watcher.poll()
    assert again is not None and again.config is None and again.previous.source == MAIN
    assert watcher.current.source == MAIN

    (canary / "config.yaml").write_text("node:\n  mode: label\n")
    fixed = watcher.poll()
    assert fixed is not None and fixed.config is not None and fixed.config.source == CANARY
    assert fixed.config.node.mode == "label"

    for name in CONFIG_FILES:  # the canary ConfigMap deleted: the kubelet empties the volume
        (canary / name).unlink(missing_ok=True)
    gone = watcher.poll()
    assert gone is not None and gone.config is not None and gone.config.source == MAIN


def test_without_a_canary_directory_the_label_changes_nothing(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("node:\n  mode: taint\n")
    cfg = load_config_dir(tmp_path)
    watcher = ConfigWatcher(tmp_path, cfg, wants_canary=lambda: True)
    assert watcher.poll() is None


# ----------------------------------------------------------------------------- would-do fields


def _engine(snap: Path, doc: dict[str, Any]) -> Engine:
    shipped = load_config_dir(ROOT / "config")
    base = parse_config(doc)
    cfg = type(shipped)(raw=base.raw, profiles=shipped.profiles, xid_catalog=shipped.xid_catalog)
    return Engine(SnapshotSource(snap), cfg)


def _annotation(eng: Engine) -> dict[str, Any]:
    for tier in ("gpu", "xid", "efa", "topology"):
        eng.run_tier(tier)
    _, marks = eng.evaluate()
    return json.loads(marks.results_json)  # type: ignore[no-any-return]


def test_observe_mode_says_what_taint_mode_would_do(tmp_path: Path) -> None:
    node = {
        "mode": "observe",
        "taintEffectBySeverity": {"reboot": "NoExecute"},
        "remediationConditions": [{"type": AHR}, {"type": "GPUReplace", "minSeverity": "isolate"}],
    }
    eng = _engine(XID79, {"node": node})
    doc = _annotation(eng)
    assert doc["status"] == "fail" and doc["severity"] == "reboot"
    assert doc[WOULD_FIELD] == {"taint": "reboot:NoExecute", "mark": [AHR]}  # isolate: not marked
    assert doc[CONFIG_FIELD] == {"source": MAIN, "digest": "", "mode": "observe"}
    _, marks = eng.evaluate()
    assert not marks.taint and not any(r.unhealthy for r in marks.remediation)  # observe does nothing


def test_a_healthy_node_has_no_would_field(tmp_path: Path) -> None:
    doc = _annotation(_engine(HEALTHY, {"node": {"mode": "observe"}}))
    assert doc["status"] == "pass" and WOULD_FIELD not in doc
    assert doc[CONFIG_FIELD]["mode"] == "observe"


def test_a_failure_below_taint_min_severity_would_not_taint(tmp_path: Path) -> None:
    doc = _annotation(_engine(XID79, {"node": {"mode": "label", "taintMinSeverity": "isolate"}}))
    assert doc["status"] == "fail" and WOULD_FIELD not in doc


def test_the_would_field_stays_bounded() -> None:
    wanted = Recovery(wanted=True, severity=Severity.RESET)
    many = {f"Type{i:02d}": wanted for i in range(MARK_MAX + 3)}
    doc = would_document(wanted, many, "NoSchedule")
    assert doc["taint"] == "reset:NoSchedule"
    assert len(doc["mark"]) == MARK_MAX + 1 and doc["mark"][-1] == "+3 more"
    assert would_document(Recovery(), {"A": Recovery()}, "NoSchedule") == {}


def test_the_rollout_fields_change_only_with_the_verdict(tmp_path: Path) -> None:
    """Steady state costs no write: cycle after cycle the fields say the same (a healthy node's whole
    annotation: test_engine.test_steady_state_marks_do_not_change); a fault changes them."""
    snap = tmp_path / "snap"
    shutil.copytree(HEALTHY, snap, symlinks=True)
    eng = _engine(snap, {"node": {"mode": "observe"}})
    first = _annotation(eng)
    again = _annotation(eng)
    assert (first[CONFIG_FIELD], first.get(WOULD_FIELD)) == (again[CONFIG_FIELD], again.get(WOULD_FIELD))
    shutil.copy(XID79 / "kmsg.log", snap / "kmsg.log")
    assert _annotation(eng)[WOULD_FIELD] == {"taint": "reboot:NoSchedule"}


# ----------------------------------------------------------------------------- status


def _node(name: str, status: str, severity: str, mode: str, **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "version": 1,
        "status": status,
        "severity": severity,
        "checkedAt": "2026-01-01T11:59:00Z",
        "checks": [],
        "latched": [],
        CONFIG_FIELD: {
            "source": extra.pop("source", MAIN),
            "digest": extra.pop("digest", "abc"),
            "mode": mode,
        },
    }
    doc.update(extra)
    labels = {K.status: status, K.severity: severity}
    return {"metadata": {"name": name, "labels": labels, "annotations": {K.results: json.dumps(doc)}}}


FLEET = [
    _node("a", "fail", "reboot", "observe", would={"taint": "reboot:NoSchedule", "mark": [AHR]}),
    _node("b", "fail", "isolate", "observe", would={"taint": "isolate:NoExecute", "mark": [AHR]}),
    _node("c", "fail", "reset", "observe", would={"taint": "reset:NoSchedule"}),
    _node("d", "pass", "none", "observe"),
    _node("e", "unknown", "none", "observe"),  # unknown never would taint
]


def test_status_counts_would_taint_and_would_mark_in_observe() -> None:
    statuses = status_list(FLEET, None, prefix=K.prefix, now=NOW)
    out = render(statuses, "table", NOW).splitlines()
    assert out[0].split()[10:14] == ["WOULD", "TAINT", "WOULD", "MARK"]
    row = {line.split()[0]: line.split() for line in out[1:6]}
    assert row["b"][5:10] == ["-", "-", "-", "isolate:NoExecute", AHR] and row["d"][5:10] == ["-"] * 5
    assert "observe (5 nodes): 3 nodes would be tainted, 2 would be marked for remediation" in out
    (item,) = [i for i in json.loads(render(statuses, "json", NOW)) if i["node"] == "a"]
    assert item["rollout"] == {
        "config": MAIN,
        "configDigest": "abc",
        "mode": "observe",
        "wouldTaint": "reboot:NoSchedule",
        "wouldMark": [AHR],
    }


def test_a_fleet_in_taint_mode_keeps_the_plain_table_and_counts_what_is_held_back() -> None:
    tainted = _node("t", "fail", "reboot", "taint", would={"taint": "reboot:NoSchedule"})
    tainted["spec"] = {"taints": [{"key": K.taint, "value": "reboot", "effect": "NoSchedule"}]}
    held = _node("h", "fail", "reboot", "taint", would={"taint": "reboot:NoSchedule"})  # the brake
    nodes = [tainted, held, _node("p", "pass", "none", "taint")]
    rows = status_rows(nodes, prefix=K.prefix, now=NOW)
    assert all(len(r) == len(HEADER) for r in rows)
    out = render(status_list(nodes, None, prefix=K.prefix, now=NOW), "table", NOW)
    assert "taint (3 nodes): 2 nodes would be tainted (1 tainted), 0 marked for remediation, 0 held" in out
    assert "configs:" not in out  # one config everywhere: nothing to say


def _marked(name: str, reason: str, status: str = "False") -> dict[str, Any]:
    node = _node(name, "fail", "reboot", "taint", would={"taint": "reboot:NoSchedule", "mark": [AHR]})
    node["spec"] = {"taints": [{"key": K.taint, "value": "reboot", "effect": "NoSchedule"}]}
    node["status"] = {"conditions": [{"type": AHR, "status": status, "reason": reason}]}
    return node


def test_in_taint_mode_status_says_how_many_are_marked_and_how_many_held() -> None:
    """The SRE's 6-node wave under a budget of 1: "1 marked, 5 held", not "6 would be marked"; the
    held ones by the conditions' hold reasons, a node whose mark is not written yet said apart."""
    nodes = [
        _marked("g2", "GPUHealthcheckGPULostReboot"),
        _marked("g3", "NvidiaXID79Error"),  # reasonStyle eks: not ours, still unhealthy
        *(_marked(f"b{i}", RemediationReason.BUDGET_HELD, "True") for i in range(3)),
        *(_marked(f"w{i}", RemediationReason.WAVE_HELD, "True") for i in range(2)),
        _marked("p", RemediationReason.PASSED, "True"),  # the write of its mark has not landed yet
        _node("ok", "pass", "none", "taint"),
    ]
    statuses = status_list(nodes, None, prefix=K.prefix, now=NOW)
    out = render(statuses, "table", NOW).splitlines()
    line = (
        "taint (9 nodes): 8 nodes would be tainted (8 tainted), 2 marked for remediation, 5 held, "
        "1 not yet marked"
    )
    assert line in out, out
    assert not any("would be marked" in x for x in out)
    by = {s.node: s.marked for s in statuses}
    assert (by["g2"], by["b0"], by["w1"], by["p"], by["ok"]) == ("marked", "held", "held", "pending", None)


def test_wide_shows_each_nodes_config_and_the_canary_spread() -> None:
    nodes = [
        _node("a", "pass", "none", "taint", digest="111111111111"),
        _node("b", "pass", "none", "taint", digest="111111111111"),
        _node("c", "pass", "none", "observe", source=CANARY, digest="222222222222"),
        {"metadata": {"name": "old", "labels": {}, "annotations": {}}},  # no annotation at all
    ]
    statuses = status_list(nodes, None, prefix=K.prefix, now=NOW)
    lines = render(statuses, "wide", NOW).splitlines()
    head = lines[0]
    assert head.split()[:16] == " ".join(WIDE_HEADER).split()[:16]
    assert "WOULD TAINT" in head and "MODE" in head and "CONFIG" in head
    row = {line.split()[0]: line for line in lines[1:5]}
    assert "canary@222222222222" in row["c"] and " observe " in row["c"]
    assert "main@111111111111" in row["a"]
    assert "configs: canary@222222222222 on 1 node, main@111111111111 on 2 nodes" in lines
    assert "observe (1 node): 0 nodes would be tainted, 0 would be marked for remediation" in lines


# ----------------------------------------------------------------------------- the DaemonSet


def test_the_daemonset_mounts_the_canary_as_an_optional_volume() -> None:
    """manifests/ (the chart's default rendering: tests/test_helm_chart.py holds them equal)."""

    from agent.cli.agent import ETC_CANARY, ETC_CONFIG

    (ds,) = [
        d
        for d in yaml_safe.load_all((ROOT / "manifests" / "60-agent.yaml").read_text())
        if d and d["kind"] == "DaemonSet"
    ]
    spec = ds["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    canary = volumes["config-canary"]["configMap"]
    assert canary == {"name": "gpu-healthcheck-config-canary", "optional": True}
    assert "optional" not in volumes["config"]["configMap"]  # the main one must exist
    (agent,) = spec["containers"]
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    assert mounts["config-canary"]["mountPath"] == str(ETC_CANARY) and mounts["config-canary"]["readOnly"]
    assert mounts["config"]["mountPath"] == str(ETC_CONFIG) and "subPath" not in mounts["config-canary"]


def test_a_canary_whose_condition_types_the_fence_refuses_is_rejected(tmp_path: Path) -> None:
    """The canary goes through the same vet as the main config (the admission fence's dry run,
    reporters/config_proof.py): a canary naming a remediation type the policy does not list is
    rejected with the fence's words, the main config stays, and it is adopted once the fence allows it."""
    main, canary = tmp_path / "main", tmp_path / "canary"
    main.mkdir()
    canary.mkdir()
    (main / "config.yaml").write_text("node:\n  mode: taint\n")
    allowed = {"GPUHealthy"}

    def vet(cfg: Any) -> str | None:
        types = [cfg.node.condition_type, *(r.type for r in cfg.node.remediation_conditions)]
        bad = [t for t in types if t not in allowed]
        return f"the admission fence refuses {bad}" if bad else None

    start = load_at_start(main, tmp_path / "state", None, vet)
    watcher = ConfigWatcher(main, start.config, canary_dir=canary, wants_canary=lambda: True, vet=vet)
    (canary / "config.yaml").write_text(
        f"node:\n  mode: taint\n  remediationConditions:\n    - type: {AHR}\n"
        "      unhealthyStatus: 'False'\n      minSeverity: reboot\n"
    )
    refused = watcher.poll()
    assert refused is not None and refused.config is None and refused.source.source == CANARY
    assert f"the admission fence refuses ['{AHR}']" in (refused.error or "")
    assert watcher.current.source == MAIN and watcher.poll() is None  # asked again only after REVET_S

    allowed.add(AHR)  # the policy now lists it (gen-configmap.py / helm upgrade); an edit re-vets at once
    (canary / "config.yaml").write_text((canary / "config.yaml").read_text() + "  recoverAfter: 4\n")
    adopted = watcher.poll()
    assert adopted is not None and adopted.config is not None and adopted.config.source == CANARY
    assert [r.type for r in adopted.config.node.remediation_conditions] == [AHR]
