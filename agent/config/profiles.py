"""instance-profiles.yaml → InstanceProfile per instance type, validated."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.core.profile import TOPO_LEVELS, InstanceProfile

_FIELDS: dict[str, tuple[str, type | tuple[type, ...]]] = {
    "gpuCount": ("gpu_count", int),
    "gpuModel": ("gpu_model", str),
    "efaCount": ("efa_count", int),
    "nvlink": ("nvlink", bool),
    "nvswitch": ("nvswitch", bool),
    "nvlinkLinksPerGpu": ("nvlink_links_per_gpu", int),
    "nicAffinity": ("nic_affinity", str),
    "pcieWidth": ("pcie_width", int),
    "connectxCount": ("connectx_count", int),
    "connectxRateGbps": ("connectx_rate_gbps", int),
    "nvswitchCount": ("nvswitch_count", int),
    "numaNodes": ("numa_nodes", int),
    "nvlinkLinkGBps": ("nvlink_link_gbps", (int, float)),
}


def parse_profiles(doc: Any) -> dict[str, InstanceProfile]:
    """Validate `instance-profiles.yaml` ({profiles: {TYPE: {...}}}); raises ValueError with the path."""
    if not isinstance(doc, Mapping) or set(doc) - {"profiles"}:
        raise ValueError("instance-profiles: expected a mapping with the single key 'profiles'")
    raw = doc.get("profiles") or {}
    if not isinstance(raw, Mapping):
        raise ValueError("instance-profiles: 'profiles' must be a mapping of instance type to profile")
    out: dict[str, InstanceProfile] = {}
    for itype, body in raw.items():
        where = f"instance-profiles: profiles.{itype}"
        if not isinstance(body, Mapping):
            raise ValueError(f"{where}: must be a mapping")
        unknown = set(body) - set(_FIELDS)
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_FIELDS)}")
        if "gpuCount" not in body:
            raise ValueError(f"{where}: gpuCount is required")
        kwargs: dict[str, Any] = {}
        for key, value in body.items():
            attr, typ = _FIELDS[key]
            if value is None:
                continue
            if typ is int and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"{where}.{key}: must be a non-negative integer, got {value!r}")
            if typ == (int, float) and (isinstance(value, bool) or not isinstance(value, typ) or value <= 0):
                raise ValueError(f"{where}.{key}: must be a positive number, got {value!r}")
            if not isinstance(value, typ):
                raise ValueError(f"{where}.{key}: must be {getattr(typ, '__name__', typ)}, got {value!r}")
            kwargs[attr] = value
        if kwargs.get("nic_affinity") not in (None, *TOPO_LEVELS):
            raise ValueError(f"{where}.nicAffinity: must be one of {TOPO_LEVELS}")
        out[str(itype)] = InstanceProfile(instance_type=str(itype), **kwargs)
    return out
