"""Xid extraction, the `xid` check and the shipped Xid catalog, on real kernel logs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent.checks import xid
from agent.checks.xid import check_xid, recovery_severity
from agent.config import Config, parse_config, yaml_safe
from agent.config.xid_catalog import parse_catalog
from agent.core.facts import NodeFacts
from agent.core.gpu import Gpu, GpuInventory
from agent.core.kernel import KernelLog, KernelRecord
from agent.core.probed import NotCaptured, ProbeError, ProbeErrorKind
from agent.core.severity import Severity, Status
from agent.probes.kernel_log import parse_kernel_log
from agent.probes.kernel_tail import fold_kernel_text
from agent.probes.xid_events import extract_xids

FIX = Path(__file__).parent / "fixtures"
XK = FIX / "xid-kernel-log"
KL = FIX / "kernel-log"
REPO_CONFIG = Path(__file__).resolve().parent.parent / "config"
CATALOG_YAML = REPO_CONFIG / "xid-catalog.yaml"

# Every Xid row of shared/reference/anchors.md §10: code → (mnemonic, NVIDIA bucket or "" when blank).
ANCHOR_TABLE: dict[int, tuple[str, str]] = {
    8: ("ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "RESTART_APP"),
    13: ("ROBUST_CHANNEL_GR_EXCEPTION", "RESTART_APP"),
    31: ("ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "RESTART_APP"),
    32: ("ROBUST_CHANNEL_PBDMA_ERROR", "RESTART_APP"),
    43: ("ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "IGNORE"),
    45: ("ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "WORKFLOW_XID_45"),
    46: ("ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "RESET_GPU"),
    48: ("ROBUST_CHANNEL_GPU_ECC_DBE", "WORKFLOW_XID_48"),
    54: ("SILENT_RUNNING_PWR_REDUCED_CLOCKING", "CHECK_MECHANICALS"),
    56: ("DISPLAY_CHANNEL_EXCEPTION", "CONTACT_SUPPORT"),
    57: ("FB_LINK_TRAINING_FAILURE_ERROR", "CONTACT_SUPPORT"),
    58: ("FB_MEMORY_ERROR", "CONTACT_SUPPORT"),
    62: ("PMU_HALT_ERROR", "RESET_GPU"),
    63: ("INFOROM_DRAM_RETIREMENT_EVENT", "IGNORE"),
    64: ("INFOROM_DRAM_RETIREMENT_FAILURE", "RESET_GPU"),
    65: ("ROBUST_CHANNEL_NVENC1_ERROR", "CONTACT_SUPPORT"),
    68: ("ROBUST_CHANNEL_NVDEC0_ERROR", "RESTART_APP"),
    69: ("ROBUST_CHANNEL_GR_CLASS_ERROR", "RESTART_APP"),
    73: ("ROBUST_CHANNEL_NVENC2_ERROR", "CONTACT_SUPPORT"),
    74: ("NVLINK_ERROR", "WORKFLOW_NVLINK_ERR"),
    79: ("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM"),
    80: ("PBDMA_PUSHBUFFER_CRC_MISMATCH", "RESTART_APP"),
    81: ("ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR", "CONTACT_SUPPORT"),
    92: ("EXCESSIVE_SBE_INTERRUPTS", "IGNORE"),
    94: ("ROBUST_CHANNEL_CONTAINED_ERROR", "RESTART_APP"),
    95: ("ROBUST_CHANNEL_UNCONTAINED_ERROR", "RESET_GPU"),
    109: ("ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "RESET_GPU"),
    110: ("SEC_FAULT_ERROR", "RESET_GPU"),
    119: ("GSP_RPC_TIMEOUT", "RESET_GPU"),
    120: ("GSP_ERROR", "RESET_GPU"),
    121: ("C2C_ERROR", "IGNORE"),
    125: ("INFOROM_FS_ERROR", "CONTACT_SUPPORT"),
    126: ("ROBUST_CHANNEL_CE10_ERROR", "RESTART_APP"),
    136: ("ALI_TRAINING_FAIL", "RESET_GPU"),
    140: ("UNRECOVERABLE_ECC_ERROR_ESCAPE", "RESET_GPU"),
    142: ("ROBUST_CHANNEL_NVENC3_ERROR", "CONTACT_SUPPORT"),
    143: ("GPU_INIT_ERROR", "RESET_GPU"),
    144: ("NVLINK_SAW_ERROR", "WORKFLOW_NVLINK5_ERR"),
    145: ("NVLINK_RLW_ERROR", "WORKFLOW_NVLINK5_ERR"),
    146: ("NVLINK_TLW_ERROR", "WORKFLOW_NVLINK5_ERR"),
    147: ("NVLINK_TREX_ERROR", "WORKFLOW_NVLINK5_ERR"),
    148: ("NVLINK_NVLPW_CTRL_ERROR", "WORKFLOW_NVLINK5_ERR"),
    149: ("NVLINK_NETIR_ERROR", "WORKFLOW_NVLINK5_ERR"),
    150: ("NVLINK_MSE_ERROR", "WORKFLOW_NVLINK5_ERR"),
    151: ("ROBUST_CHANNEL_KEY_ROTATION_ERROR", "RESTART_VM"),
    154: ("GPU_RECOVERY_ACTION_CHANGED", "XID_154"),
    155: ("NVLINK_SW_DEFINED_ERROR", "RESET_GPU"),
    156: ("RESOURCE_RETIREMENT_EVENT", "RESET_GPU"),
    157: ("RESOURCE_RETIREMENT_FAILURE", "IGNORE"),
    158: ("GPU_FATAL_TIMEOUT", "RESET_GPU"),
    159: ("ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "CHECK_UVM"),
    162: ("PSHC_REENGAGED", ""),
    163: ("PSHC_DISENGAGED", ""),
    164: ("PSHC_LOW_LIFETIME", ""),
    165: ("PSHC_ZERO_LIFETIME", ""),
    166: ("NVLINK_SECURE_CRYPTO_ERR", ""),
    167: ("PCIE_FATAL_TIMEOUT", ""),
    168: ("REDUCED_GPU_MEMORY_CAPACITY", ""),
    169: ("SEC2_HALT_ERROR", ""),
    170: ("NVLINK_SECURE_OTHER", ""),
    171: ("UNCORRECTABLE_DRAM_ERROR", ""),
    172: ("UNCORRECTABLE_SRAM_ERROR", ""),
}
# NVIDIA bucket → our severity (the mapping the catalog header documents).
BUCKET_SEVERITY = {
    "RESTART_APP": "monitor",
    "IGNORE": "monitor",
    "RESET_GPU": "reset",
    "RESTART_BM": "reboot",
    "RESTART_VM": "reboot",
    "CHECK_MECHANICALS": "isolate",
    "WORKFLOW_XID_48": "reset",
    "WORKFLOW_XID_45": "monitor",
    "WORKFLOW_NVLINK_ERR": "nvlink",
    "WORKFLOW_NVLINK5_ERR": "monitor",
    "XID_154": "monitor",
    "CHECK_UVM": "reset",
    "UPDATE_SWFW": "monitor",
}


APP_FAULTS = (13, 31, 43, 45)  # none one by one, monitor as a storm (the catalog's header says why)


def _facts(path: Path, gpus: GpuInventory | None = None) -> NodeFacts:
    log = fold_kernel_text(path.read_text(encoding="utf-8"))
    if gpus is None:
        return NodeFacts(kernel=log)
    return NodeFacts(kernel=log, gpus=gpus)


def _real(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if not p.name.endswith(".source.txt") and "DERIVED" not in p.name)


# --------------------------------------------------------------------------- extract_xids


def test_extract_xid48_63_94() -> None:
    log = parse_kernel_log((XK / "gpud-h100-xid48-63-94-dbe-rowremap-iso.log").read_text())
    events = extract_xids(log)
    assert [e.code for e in events] == [48, 63] + [94] * 9
    assert {e.pci for e in events} == {"00000000:19:00.0"}
    assert not any(e.sxid for e in events)
    assert events[0].message.startswith("Xid (PCI:0000:19:00): 48, pid='<unknown>'")
    assert events[0].wallclock == "2024-11-15T12:02:03,470068+00:00"


def test_extract_xid79_and_sxid_from_blockquote() -> None:
    log = parse_kernel_log((XK / "gpud-hgx-xid79-fallen-off-bus-plus-sxid20034-BLOCKQUOTE.txt").read_text())
    events = extract_xids(log)
    xids = [e for e in events if not e.sxid]
    sxids = [e for e in events if e.sxid]
    # the numbered Xid 79 line and the number-less "GPU has fallen off the bus." companion line
    assert [(e.code, e.pci) for e in xids] == [(79, "00000000:91:00.0")] * 2
    assert xids[0].ts_us == 6781741548779
    assert len(sxids) == 8
    assert {e.code for e in sxids} == {20034}
    assert {e.pci for e in sxids} == {"00000000:05:00.0", "00000000:06:00.0", "00000000:07:00.0"}
    assert (
        sxids[0].message == "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up"
    )


def test_extract_blackwell_nvlink_lines() -> None:
    log = parse_kernel_log(
        (XK / "issue-gpud-pr1160-1174-blackwell-nvlink-xid144-145-149-lines.log").read_text()
    )
    events = extract_xids(log)
    assert [(e.code, e.pci) for e in events] == [
        (144, "00000000:01:00.0"),
        (149, "00000000:00:00.0"),
        (149, "00000000:00:00.0"),
        (149, "00000019:01:00.0"),
        (145, "00000018:01:00.0"),
    ]


@pytest.mark.parametrize(
    ("line", "code", "pci"),
    [
        ("NVRM: Xid (PCI:0000:3b:00.0): 48, pid=1, DBE", 48, "00000000:3b:00.0"),
        ("NVRM: Xid (0000:3b:00): 13, 0001 00000000 0000a0c0", 13, "00000000:3b:00.0"),
        (
            "NVRM: The NVIDIA GPU 0000:3b:00.0 (PCI ID: 10de:2330) has fallen off the bus.",
            79,
            "00000000:3b:00.0",
        ),
        (
            "NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (x)",
            154,
            "00000008:01:00.0",
        ),
        ("NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.", 79, "00000000:3b:00.0"),
        ("NVRM: Xid (<unknown>): 119, Timeout after 6s", 119, None),
    ],
)
def test_extract_line_variants(line: str, code: int, pci: str | None) -> None:
    (ev,) = extract_xids(KernelLog((KernelRecord(line),), "plain"))
    assert (ev.code, ev.pci) == (code, pci)


def test_xid154_recovery_action_is_last_parentheses() -> None:
    line = (
        "NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) "
        "to 0x1 (GPU Reset Required)"
    )
    (ev,) = extract_xids(KernelLog((KernelRecord(line),), "plain"))
    assert (ev.code, ev.pci, ev.recovery_action) == (154, "00000008:01:00.0", "GPU Reset Required")


def test_gsp_banner_lines_make_no_event() -> None:
    # The banner NVIDIA's driver README quotes around an Xid 119: one event, not two.
    text = (
        " NVRM: _kgspLogXid119: ********************************* GSP Timeout "
        "**********************************\n"
        " NVRM: Xid (PCI:0000:01:00): 119, Timeout after 6s of waiting for RPC response from GPU0 GSP! "
        "Expected function 76 (GSP_RM_CONTROL) sequence 1321\n"
    )
    assert [e.code for e in extract_xids(parse_kernel_log(text))] == [119]
    talos = KL / "issue-open-gpu-1118-a100x8-talos-kern-warning-gsp-rpc-history-EXCERPT.log"
    assert extract_xids(parse_kernel_log(talos.read_text())) == []


def test_user_space_xid_text_in_syslog_is_ignored() -> None:
    text = "Jun 20 21:24:53 host gpu-healthcheck[42]: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off\n"
    assert extract_xids(parse_kernel_log(text)) == []


@pytest.mark.parametrize("path", _real(KL), ids=lambda p: p.name)
def test_no_xid_in_context_logs(path: Path) -> None:
    assert extract_xids(parse_kernel_log(path.read_text())) == []


# --------------------------------------------------------------------------- check_xid


def test_healthy_h100_boot_passes(cfg: Config) -> None:
    res = check_xid(_facts(KL / "gpud-h100-boot-dmesg-decode-iso-no-xid.log"), cfg)
    assert res.status is Status.PASS
    assert res.findings == ()
    assert "no Xid" in res.message


def test_xid48_63_94_fails_with_reset(cfg: Config) -> None:
    gpus = GpuInventory(source="test", gpus=(Gpu(index=3, pci_bus_id="00000000:19:00.0"),))
    res = check_xid(_facts(XK / "gpud-h100-xid48-63-94-dbe-rowremap-iso.log", gpus), cfg)
    assert res.status is Status.FAIL
    assert res.severity is Severity.RESET
    by_code = {f.rule: f for f in res.findings}
    assert set(by_code) == {"xid.48", "xid.63", "xid.94"}
    f48 = by_code["xid.48"]
    assert f48.severity is Severity.RESET
    assert f48.message.startswith("Xid 48 (ROBUST_CHANNEL_GPU_ECC_DBE) on GPU 3 (0000:19:00.0) ×1: ")
    assert "double bit error" in f48.message
    assert f48.entities == ("GPU 3 (0000:19:00.0)",)
    assert f48.key == "xid/48/0000:19:00.0"
    assert f48.latched
    assert by_code["xid.63"].severity is Severity.MONITOR
    assert by_code["xid.94"].severity is Severity.MONITOR
    assert "×9" in by_code["xid.94"].message
    assert res.findings[0].rule == "xid.48"  # the worst first


def test_xid79_blockquote_reboots(cfg: Config) -> None:
    res = check_xid(_facts(XK / "gpud-hgx-xid79-fallen-off-bus-plus-sxid20034-BLOCKQUOTE.txt"), cfg)
    assert res.status is Status.FAIL
    assert res.severity is Severity.REBOOT
    (f79,) = [f for f in res.findings if f.rule == "xid.79"]
    assert f79.severity is Severity.REBOOT
    assert "Xid 79 (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS) on GPU 0000:91:00.0 ×1:" in f79.message
    assert f79.entities == ("0000:91:00.0",)
    sx = [f for f in res.findings if f.rule == "xid.sxid"]
    assert {f.key for f in sx} == {
        "sxid/20034/0000:05:00.0",
        "sxid/20034/0000:06:00.0",
        "sxid/20034/0000:07:00.0",
    }
    assert all(f.severity is Severity.MONITOR and f.latched for f in sx)
    assert any("SXid 20034 on NVSwitch 0000:05:00.0 ×4" in f.message for f in sx)


def test_xid79_without_number_still_reboots(cfg: Config) -> None:
    path = XK / "gpud-hgx-xid79-fallen-off-bus-plus-sxid20034-BLOCKQUOTE-DERIVED-no-xid-number.txt"
    res = check_xid(_facts(path), cfg)
    assert res.status is Status.FAIL
    (f79,) = [f for f in res.findings if f.rule == "xid.79"]
    assert f79.severity is Severity.REBOOT
    assert "0000:91:00.0" in f79.message
    assert "GPU has fallen off the bus" in f79.message


def test_xid13_43_application_faults_are_reported_without_a_warning(cfg: Config) -> None:
    """629 Xid 13 lines over 2 h 20 min of crashing jobs: below the storm rate, `none` (listed, no warn)."""
    res = check_xid(_facts(XK / "gpud-h100-xid13-43-dmesg-decode-iso.log"), cfg)
    assert res.status is Status.PASS
    assert res.severity is Severity.NONE
    msgs = {f.rule: f.message for f in res.findings}
    assert set(msgs) == {"xid.13", "xid.43"}
    assert msgs["xid.13"].startswith(
        "Xid 13 (ROBUST_CHANNEL_GR_EXCEPTION) on GPU 0000:38:00.0 ×629, 59/min: "
    )
    assert "×7" in msgs["xid.43"]
    assert all(len(m.split(": ", 1)[1]) <= 160 for m in msgs.values())


def test_blackwell_nvlink_lines_are_decoded_by_nvidias_sheet(cfg: Config) -> None:
    """Each NVLink5 line's IntrInfo/ErrorStatus decoded with NVIDIA's "Xid 144-150 Decode" sheet: a
    RESET_GPU sub-code takes xid.nvlinkSeverity (reset), an IGNORE one stays monitor, even when the
    driver prints "Fatal" (0x026001c6 is a link-down NVIDIA says to ignore; 0x025001c6 is not)."""
    res = check_xid(_facts(XK / "issue-gpud-pr1160-1174-blackwell-nvlink-xid144-145-149-lines.log"), cfg)
    assert res.status is Status.FAIL
    by_key = {f.key: f for f in res.findings}
    down = "NETIR_LINK_EVT/NETIR_LINK_DOWN"
    assert {k: f.severity for k, f in by_key.items()} == {
        f"xid/149/0000:00:00.0/{down}/reset_gpu": Severity.RESET,  # 0x025001c6
        "xid/149/0019:01:00.0/NETIR/NETIR_INT/reset_gpu": Severity.RESET,
        "xid/144/0000:01:00.0/SAW_MVB/ignore": Severity.MONITOR,
        f"xid/149/0000:00:00.0/{down}/ignore": Severity.MONITOR,  # 0x026001c6
        "xid/145/0018:01:00.0/RLW_RXPIPE/ignore": Severity.MONITOR,
    }
    reset = by_key[f"xid/149/0000:00:00.0/{down}/reset_gpu"].message
    assert f"({down}, Link Fatal: RESET_GPU): Xid (PCI:0000:00:00): 149, NETIR_LINK_EVT Fatal" in reset
    assert "(RLW_RXPIPE, Non-fatal: IGNORE)" in by_key["xid/145/0018:01:00.0/RLW_RXPIPE/ignore"].message
    reset_default = parse_config(
        {"xid": {"nvlinkSeverity": "reboot"}}, catalog_doc=yaml_safe.load(CATALOG_YAML.read_text())
    )
    res = check_xid(
        _facts(XK / "issue-gpud-pr1160-1174-blackwell-nvlink-xid144-145-149-lines.log"), reset_default
    )
    assert res.severity is Severity.REBOOT  # the configured NVLink default


@pytest.mark.parametrize(
    ("variant", "severity"),
    [
        ("xid154-gpu-reset-required", Severity.RESET),
        ("xid154-node-reboot-required", Severity.REBOOT),
        ("xid154-reset-then-none", Severity.MONITOR),
    ],
)
def test_xid154_escalates_by_recovery_text(cfg: Config, variant: str, severity: Severity) -> None:
    path = XK / f"gpud-h100-xid48-63-94-dbe-rowremap-iso-DERIVED-{variant}.log"
    res = check_xid(_facts(path), cfg)
    (f,) = res.findings
    assert f.rule == "xid.154"
    assert f.severity is severity
    assert "GPU 0000:19:00.0" in f.message


@pytest.mark.parametrize(
    ("text", "sev"),
    [
        ("Node Reboot Required", Severity.REBOOT),
        ("System Reboot", Severity.REBOOT),
        ("GPU Reset Required", Severity.RESET),
        ("Drain and Reset", Severity.RESET),
        ("Drain P2P", Severity.RESET),
        ("Bus Reset", Severity.RESET),
        ("None", Severity.NONE),
        (None, Severity.NONE),
    ],
)
def test_recovery_severity(text: str | None, sev: Severity) -> None:
    assert recovery_severity(text) is sev


@pytest.mark.parametrize(
    "name",
    [
        "gpud-journalctl-short-iso-peermem-errors-DERIVED-two-boots-xid-in-earlier-boot.log",
        "gpud-kmsg-raw-nvswitch-open-DERIVED-two-boots-xid-in-earlier-boot.log",
    ],
)
def test_xid_of_earlier_boot_is_ignored(cfg: Config, name: str) -> None:
    path = KL / name
    assert "Xid (PCI:0000:3b:00): 79" in path.read_text()
    res = check_xid(_facts(path), cfg)
    assert res.status is Status.PASS
    assert res.findings == ()


def test_unknown_code_uses_its_rule(cfg: Config) -> None:
    log = fold_kernel_text("NVRM: Xid (PCI:0000:3b:00): 999, something new")
    res = check_xid(NodeFacts(kernel=log), cfg)
    (f,) = res.findings
    assert f.rule == "xid.unknown-code"
    assert f.severity is cfg.severity(xid.UNKNOWN_CODE)
    assert "Xid 999 (UNKNOWN)" in f.message


def test_missing_and_unreadable_kernel_log(cfg: Config) -> None:
    skipped = check_xid(NodeFacts(kernel=NotCaptured("kmsg.log")), cfg)
    assert skipped.status is Status.SKIPPED
    err = ProbeError("/dev/kmsg", ProbeErrorKind.UNAVAILABLE, "permission denied")
    unknown = check_xid(NodeFacts(kernel=err), cfg)
    assert unknown.status is Status.UNKNOWN
    assert "permission denied" in unknown.message


# --------------------------------------------------------------------------- catalog


def test_catalog_loads_and_covers_the_anchor_table(cfg: Config) -> None:
    entries = cfg.xid_catalog.entries
    assert set(ANCHOR_TABLE) <= set(entries)
    for code, (name, bucket) in ANCHOR_TABLE.items():
        assert entries[code].name == name, code
        assert entries[code].nvidia_action == bucket, code


def test_catalog_severities_follow_the_documented_mapping() -> None:
    doc = yaml_safe.load(CATALOG_YAML.read_text())
    assert doc["version"] == 1
    assert doc["unknownSeverity"] == "monitor"
    for code, body in doc["codes"].items():
        assert set(body) <= {"name", "nvidia", "severity", "note", "storm"}
        assert body["severity"] in {"monitor", "reset", "reboot", "isolate", "nvlink"} or code in APP_FAULTS
        bucket = body["nvidia"]
        if code in APP_FAULTS:
            assert (body["severity"], body["storm"]) == ("none", "monitor"), code
        elif bucket in BUCKET_SEVERITY:
            assert body["severity"] == BUCKET_SEVERITY[bucket], code
        elif bucket == "CONTACT_SUPPORT":
            assert body["severity"] == "monitor", code
    picks = {c: doc["codes"][c]["severity"] for c in (54, 63, 64, 74, 79, 95, 159, 167, 168, 171, 172)}
    assert picks == {
        54: "isolate",
        63: "monitor",
        64: "reset",
        74: "nvlink",
        79: "reboot",
        95: "reset",
        159: "reset",
        167: "reboot",
        168: "reboot",
        171: "reset",
        172: "reset",
    }
    # Every code NVIDIA marks used on A100/H100/B100/GB200 (shared/reference/xid-catalog-check.md §2).
    used_missing_before = {
        11,
        14,
        25,
        37,
        38,
        39,
        40,
        41,
        44,
        60,
        66,
        67,
        70,
        71,
        72,
        75,
        76,
        77,
        78,
        82,
        83,
        84,
        85,
    }
    used_missing_before |= {86, 88, 89, 93, *range(96, 109), *range(127, 136), 137, 139, 141, 160, 161}
    assert len(used_missing_before) == 54 and used_missing_before <= set(doc["codes"])


def test_catalog_header_names_every_deviation() -> None:
    header = "\n".join(ln for ln in CATALOG_YAML.read_text().splitlines() if ln.startswith("#"))
    for code in (54, 63, 64, 74, 79, 95, 142, 159, 167, 168, 169, 171, 172):
        assert re.search(rf"\b{code}\b", header), code


def test_nvlink_default_and_overrides() -> None:
    doc = yaml_safe.load(CATALOG_YAML.read_text())
    base = parse_config({}, None, doc)
    assert base.xid_severity(74) is Severity.RESET
    assert base.xid_severity(63) is Severity.MONITOR
    strict = parse_config({"xid": {"overrides": {"63": "isolate"}, "nvlinkSeverity": "reboot"}}, None, doc)
    assert strict.xid_severity(63) is Severity.ISOLATE
    assert strict.xid_severity(74) is Severity.REBOOT
    assert parse_catalog(doc).severity(12345) is Severity.MONITOR


def test_override_changes_the_check_verdict() -> None:
    doc = yaml_safe.load(CATALOG_YAML.read_text())
    strict = parse_config({"xid": {"overrides": {"63": "isolate"}}}, None, doc)
    res = check_xid(_facts(XK / "gpud-h100-xid48-63-94-dbe-rowremap-iso.log"), strict)
    assert res.severity is Severity.ISOLATE
    assert res.findings[0].rule == "xid.63"


def test_nvlink5_decode_follows_the_drivers_bit_patterns(cfg: Config) -> None:
    """The sheet has one IntrInfo pattern for drivers < R575 and one for >= R575; the GPU's driver
    version picks it. NVSentinel's test line 0x025525c6 decodes to RESET_GPU with the < R575 table."""
    cat = cfg.xid_catalog
    assert len(cat.nvlink5) == 95 and sum(r.bucket == "RESET_GPU" for r in cat.nvlink5) == 42
    row = cat.decode_nvlink5(149, 0x025525C6, 0, driver_major=570)
    assert row is not None and (row.mnemonic, row.bucket) == ("NETIR_LINK_EVT/NETIR_LINK_DOWN", "RESET_GPU")
    assert cat.decode_nvlink5(149, 0x025525C6, 0, driver_major=580) is None  # not a >= R575 pattern
    row = cat.decode_nvlink5(144, 0x1, 0x8, driver_major=580)
    assert row is not None and (row.mnemonic, row.bucket) == ("SAW_MVB", "IGNORE")
    text = "NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000)\n"
    gpus = GpuInventory(
        source="test", gpus=(Gpu(index=2, pci_bus_id="00000018:01:00.0"),), driver_version="580.65.06"
    )
    (f,) = check_xid(NodeFacts(kernel=fold_kernel_text(text), gpus=gpus), cfg).findings
    assert (f.key, f.severity) == ("xid/149/0018:01:00.0/fatal", Severity.RESET)  # no >= R575 row: "Fatal"


def test_the_nvlink5_decode_table_is_validated() -> None:
    doc = yaml_safe.load(CATALOG_YAML.read_text())
    doc["nvlink5Decode"] = [[149, "X", "01x", "0", "", "RESET_GPU", "Fatal"]]
    with pytest.raises(ValueError, match="IntrInfo patterns"):
        parse_catalog(doc)
