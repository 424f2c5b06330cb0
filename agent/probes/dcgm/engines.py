"""Which pods on a node run a DCGM host engine (pure: a PodList in, names out).

Two engines on one node give contradictory views and can break each other's modules (dcgm.md §7.4), so
the engine's entrypoint refuses to start next to another one and the agent reports a second one. An
engine is either a standalone nv-hostengine (NVIDIA's DCGM image, the GPU Operator's `nvidia-dcgm`, or
ours) or a dcgm-exporter that is not in remote mode: without DCGM_REMOTE_HOSTENGINE_INFO or
-r/--remote-hostengine-info it embeds an engine of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

ENGINE_IMAGES = ("dcgm", "hostengine")  # nvcr.io/nvidia/cloud-native/dcgm, ghcr.io/gpu-healthcheck/hostengine
EXPORTER_IMAGES = ("dcgm-exporter",)
REMOTE_ENV = "DCGM_REMOTE_HOSTENGINE_INFO"
REMOTE_FLAGS = ("-r", "--remote-hostengine-info")


def _repo(image: str) -> str:
    """Last path element without tag or digest: nvcr.io/nvidia/k8s/dcgm-exporter:4.6 → dcgm-exporter."""
    name = image.split("@", 1)[0].rsplit("/", 1)[-1]
    return name.split(":", 1)[0]


def engine_kind(container: Mapping[str, Any]) -> str | None:
    """What kind of DCGM engine a container runs, or None."""
    repo = _repo(str(container.get("image", "")))
    words = [str(w) for w in [*(container.get("command") or ()), *(container.get("args") or ())]]
    if repo in ENGINE_IMAGES:  # the image's own entrypoint is the engine; a command must name it
        named = any(w.rsplit("/", 1)[-1] == "nv-hostengine" for w in words) or "hostengine" in words
        return "nv-hostengine" if not container.get("command") or named else None
    if repo in EXPORTER_IMAGES:
        env = {str(e.get("name")) for e in container.get("env") or () if isinstance(e, Mapping)}
        remote = REMOTE_ENV in env or any(
            w in REMOTE_FLAGS or w.startswith("--remote-hostengine-info=") for w in words
        )
        return None if remote else "dcgm-exporter with an embedded engine"
    return None


def engines_in(listing: Mapping[str, Any], exclude: Iterable[str] = ()) -> list[str]:
    """`namespace/name (kind)` of every pod in a PodList that runs a DCGM engine, minus `exclude`
    (namespace/name of pods to leave out, e.g. the caller's own)."""
    skip = set(exclude)
    out: list[str] = []
    for pod in listing.get("items") or ():
        meta = pod.get("metadata") or {}
        ref = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        if ref in skip or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        kinds = {k for c in (pod.get("spec") or {}).get("containers") or () if (k := engine_kind(c))}
        out.extend(f"{ref} ({k})" for k in sorted(kinds))
    return out
