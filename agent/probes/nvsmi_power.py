"""A GPU's performance state and power limits, as nvidia-smi's XML and text views and NVML say them.

Apart from the other nvidia-smi field readers so that each view's parser adds one line for it.
XML and text name the limit in force "Current Power Limit" (drivers ≥ 530) or "Enforced Power
Limit" (older); NVML returns milliwatts and the state as an integer (32: unknown).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any

from agent.core.gpu import GpuPower

_WATTS = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*W\s*$")
_LIMIT_TAGS = ("current_power_limit", "enforced_power_limit")
_PSTATE = re.compile(r"^P([0-9]{1,2})$")


def watts(raw: str | None) -> float | None:
    """ "700.00 W" → 700.0; "N/A", "[N/A]", "Unknown Error" → None."""
    m = _WATTS.match(raw or "")
    return float(m.group(1)) if m else None


def pstate(raw: str | None) -> str | None:
    text = (raw or "").strip()
    return text if _PSTATE.match(text) else None


def _first(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)


def xml_power(el: ET.Element) -> GpuPower:
    def text(path: str) -> str | None:
        node = el.find(path)
        return node.text if node is not None else None

    sections = ("gpu_power_readings", "power_readings")
    return GpuPower(
        performance_state=pstate(text("performance_state")),
        enforced_limit_w=_first(*(watts(text(f"{s}/{k}")) for s in sections for k in _LIMIT_TAGS)),
        default_limit_w=_first(*(watts(text(f"{s}/default_power_limit")) for s in sections)),
    )


def text_power(get: Callable[..., str | None]) -> GpuPower:
    """`get(*path)` reads a value of the GPU's block of `nvidia-smi -q` by its section path."""
    sections = ("GPU Power Readings", "Power Readings")
    return GpuPower(
        performance_state=pstate(get("Performance State")),
        enforced_limit_w=_first(
            *(watts(get(s, k)) for s in sections for k in ("Current Power Limit", "Enforced Power Limit"))
        ),
        default_limit_w=_first(*(watts(get(s, "Default Power Limit")) for s in sections)),
    )


def nvml_power(call: Callable[[str], Any]) -> GpuPower:
    """`call(name)` runs an NVML getter on the GPU's handle: its value, or None when unsupported."""
    state = call("nvmlDeviceGetPerformanceState")
    enforced = call("nvmlDeviceGetEnforcedPowerLimit")
    default = call("nvmlDeviceGetPowerManagementDefaultLimit")
    return GpuPower(
        performance_state=f"P{state}" if isinstance(state, int) and 0 <= state <= 15 else None,
        enforced_limit_w=enforced / 1000.0 if isinstance(enforced, int) and enforced > 0 else None,
        default_limit_w=default / 1000.0 if isinstance(default, int) and default > 0 else None,
    )
