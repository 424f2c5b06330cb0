"""Every severity knob a check can turn, with its default (overridable under `severities:` in config).

Xid codes are not here: their severities come from config/xid-catalog.yaml.
"""

from __future__ import annotations

from agent.core.severity import Severity

M, RS, RB, ISO = Severity.MONITOR, Severity.RESET, Severity.REBOOT, Severity.ISOLATE

RULES: dict[str, tuple[Severity, str]] = {
    "gpu.count.mismatch": (ISO, "visible GPUs differ from the instance profile"),
    "gpu.count.model": (M, "GPU model differs from the instance profile"),
    "gpu.responsive.lost": (RB, "the driver cannot talk to a GPU (GPU is lost / no device handle)"),
    "gpu.responsive.timeout": (RB, "nvidia-smi/NVML hung past its timeout"),
    "gpu.responsive.driver": (RB, "nvidia-smi/NVML cannot talk to the driver (not loaded, version mismatch)"),
    "gpu.ecc.dram-uncorrectable": (RS, "volatile uncorrectable DRAM ECC errors"),
    "gpu.ecc.sram-uncorrectable": (ISO, "uncorrectable SRAM ECC errors (volatile or aggregate)"),
    "gpu.ecc.sram-threshold": (ISO, "aggregate SRAM error threshold exceeded"),
    "gpu.row-remap.failure": (ISO, "row remapping failed (no spare rows)"),
    "gpu.row-remap.pending": (RS, "a row remap waits for a GPU reset"),
    "gpu.retired-pages.double-bit": (ISO, "pages retired for double-bit ECC errors"),
    "gpu.retired-pages.pending": (RB, "page retirement pending"),
    "gpu.retired-pages.single-bit": (M, "more single-bit retired pages than the threshold"),
    "gpu.recovery-action.reset": (RS, "the driver asks for a GPU reset"),
    "gpu.recovery-action.reboot": (RB, "the driver asks for a node reboot"),
    "gpu.recovery-action.drain": (RS, "the driver asks to drain and reset"),
    "gpu.throttle.hw-slowdown": (M, "HW slowdown active"),
    "gpu.throttle.hw-thermal": (M, "HW thermal slowdown active"),
    "gpu.throttle.hw-power-brake": (M, "HW power brake slowdown active"),
    "gpu.pcie.width": (M, "PCIe link width below its maximum"),
    "gpu.persistence.disabled": (M, "persistence mode disabled"),
    "gpu.fabric.incomplete": (RS, "NVSwitch fabric registration not completed/successful"),
    "gpu.allocatable.below-visible": (M, "the device plugin advertises fewer GPUs than are visible"),
    "xid.sxid": (M, "NVSwitch SXid in the kernel log"),
    "xid.unknown-code": (M, "an Xid code not in the catalog"),
    "nvlink.no-active": (ISO, "a GPU has no active NVLink"),
    "nvlink.some-inactive": (RS, "a GPU has some NVLinks inactive"),
    "topology.gpu-count": (ISO, "topo -m GPU rows differ from the profile"),
    "topology.x-off-diagonal": (ISO, "an X off the diagonal of topo -m"),
    "topology.not-nv-connected": (ISO, "NVLink expected but a GPU pair is not NV-connected"),
    "topology.nic-affinity": (M, "GPU-to-NIC affinity worse than the profile expects"),
    "efa.count": (ISO, "EFA device count differs from the profile"),
    "efa.port-down": (RB, "an EFA port is not ACTIVE"),
    "efa.counter-rate": (M, "an EFA error counter grows faster than its limit"),
    "dcgm-diag.fail-isolate": (ISO, "a DCGM diag test failed with an ISOLATE-severity error"),
    "dcgm-diag.fail-reset": (RS, "a DCGM diag test failed with a RESET-severity error"),
    "dcgm-diag.fail": (
        ISO,
        "a DCGM diag test failed, no reset/isolate severity (TRIAGE, UNKNOWN, 3.x)",
    ),
    "dcgm-diag.warn": (M, "a DCGM diag test warned (or failed only with monitor/config-severity errors)"),
    "dcgm-health.unlisted-fail": (RS, "a DCGM health FAIL incident not in config/dcgm-incidents.yaml"),
    "dcgm-health.unlisted-warn": (M, "a DCGM health WARN incident not in config/dcgm-incidents.yaml"),
}


def default_severity(rule: str) -> Severity:
    return RULES[rule][0]
