"""Validate before service on a DRA-only node: the startup taint waits for NVIDIA's DRA driver to
publish the node's GPUs (docs/guides/validate-before-service.md), so that a node whose driver has not
started yet, or publishes 7 of its 8 GPUs, takes no workload it cannot serve.

Whether the driver is expected here (node.validate.waitForDriver): `auto` (default) on a Node without
`nvidia.com/gpu` (no device plugin registered GPUs) in a cluster where the driver's DeviceClass
`gpu.nvidia.com` exists (its Helm chart and the GPU Operator's GPUCluster install it); `always` on
every Node without `nvidia.com/gpu`, without asking; `never`: no wait. The DeviceClass is read once
per validation (one GET, only while a Node without `nvidia.com/gpu` waits; reporters/driver_class),
never per cycle; an answer that could not be read is asked again after RETRY_S and keeps the wait
(we could not tell: the taint stays).

Published: every GPU NVML/nvidia-smi lists has a device in this node's gpu.nvidia.com ResourceSlices
(by PCI address, else UUID: core/dra), a GPU in MIG mode with no MIG device excepted (there is
nothing to publish); with node.validate.requireAllPublished false, any GPU published is enough (a
missing one is then gpu.allocatable's warn). The wait has a bound (node.validate.driverTimeoutSeconds,
counted like the validating time: from the Node's creation on a Node never validated, else from when
the agent saw the taint): past it the taint stays, with the reason in the results annotation, one
Event and the log; a publication that comes later still lifts it. Pure but for the reader it is
handed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.config.settings import ValidateSettings
from agent.core.dra import DraSlices
from agent.core.gpu import GpuInventory
from agent.core.node import NodeObject
from agent.core.probed import ProbeError

DRA_DRIVER = "dra-driver"  # what the pass waits for (waitingFor, the metric's `what`)
ALWAYS, NEVER = "always", "never"  # node.validate.waitForDriver, beside the default "auto"
RETRY_S = 60.0  # a DeviceClass read that failed is asked again after this long
NVIDIA_DRA = "NVIDIA's DRA driver"

# The DeviceClass reader: True (it exists), False (it does not: the driver is not installed), or why
# it could not be read.
ClassReader = Callable[[], bool | str]


@dataclass(frozen=True)
class Publication:
    """The GPUs seen against what the driver publishes for this node."""

    seen: int = 0  # the GPUs NVML/nvidia-smi list that the driver can publish
    published: int = 0
    missing: tuple[str, ...] = ()  # labels of the GPUs not published ("GPU 3 (0000:86:00.0)")
    unread: str = ""  # why they could not be compared ("": compared)

    def done(self, require_all: bool) -> bool:
        if self.unread:
            return False
        return self.published == self.seen if require_all else (self.published > 0 or self.seen == 0)

    def counted(self) -> str:
        """`7 of 8 published; not GPU 3 (0000:86:00.0)`, or why nothing could be counted."""
        if self.unread:
            return self.unread
        said = f"{self.published} of {self.seen} published"
        return f"{said}; not {', '.join(self.missing)}" if self.missing else said


def publication(gpus: Any, dra: Any) -> Publication:
    """Compare the inventory with the slices (either may be missing or unreadable)."""
    if not isinstance(gpus, GpuInventory):
        return Publication(unread="the GPUs are not read yet")
    if isinstance(dra, ProbeError):
        return Publication(unread=f"its ResourceSlices could not be read: {dra.message}")
    if not isinstance(dra, DraSlices):
        dra = DraSlices(node="")  # not watched or not captured: nothing published that we know of
    if dra.incomplete:
        return Publication(unread=f"its ResourceSlices are being republished: {dra.incomplete}")
    seen = published = 0
    missing: list[str] = []
    for g in gpus.gpus:
        hit = dra.published(g.pci_bus_id, g.uuid) is not None
        if not hit and g.mig_mode:
            continue  # MIG on and no MIG device made: nothing to publish (gpu.allocatable notes it)
        seen += 1
        published += hit
        if not hit:
            missing.append(g.label)
    return Publication(seen, published, tuple(missing))


@dataclass
class DriverWait:
    """The driver wait of one validation (reset with it); *read*: the DeviceClass reader the wiring
    hands in (None: no API server to ask, as for a snapshot judged offline)."""

    read: ClassReader | None = None
    answer: bool | str | None = None  # the DeviceClass as read in this validation (None: not asked)
    asked_at: float | None = None
    announced: bool = False  # the timeout's Event of this validation is out
    said: str = ""  # what the results annotation's `validating` says of it ("": no wait)
    timed_out: bool = False

    def reset(self) -> None:
        self.answer, self.asked_at, self.announced, self.said, self.timed_out = None, None, False, "", False

    def expected(self, mode: str, node: Any, now: float) -> bool | str:
        """True: the driver is expected to publish this node's GPUs; False: no wait; a string: we
        could not tell (the wait holds)."""
        if mode == NEVER or not isinstance(node, NodeObject) or node.plugin_gpus > 0:
            return False
        if mode == ALWAYS:
            return True
        if self.read is None:
            return False  # no API server to ask (a snapshot judged offline): nothing to wait for
        stale = isinstance(self.answer, str) and (self.asked_at is None or now - self.asked_at >= RETRY_S)
        if self.answer is None or stale:
            self.answer, self.asked_at = self.read(), now
        return self.answer


@dataclass(frozen=True)
class Waiting:
    """What the wait means for this verdict: wait or not, what to say, the timeout's Event text."""

    waiting: bool = False
    note: str = ""  # "NVIDIA's DRA driver to publish the GPUs (7 of 8 published; not GPU 3 (…))"
    timeout: str = ""  # the reason, once the bound has passed ("" before)
    announce: bool = False  # the timeout's Event and log line go out with this verdict


def wait(
    state: DriverWait,
    policy: ValidateSettings,
    node: Any,
    inputs: tuple[Any, Any],
    now: float,
    since: float | None,
    taint_key: str,
) -> Waiting:
    """One verdict's driver wait. *inputs*: (the GPU inventory, the DRA slices) as last read."""
    expected = state.expected(policy.wait_for_driver, node, now)
    if expected is False:
        state.said, state.timed_out = "", False
        return Waiting()
    if isinstance(expected, str):
        pub = Publication(unread=f"cannot tell whether it runs here: {expected}")
    else:
        pub = publication(*inputs)
        if pub.done(policy.require_all_published):
            state.said, state.timed_out = "", False
            return Waiting()
    note = f"{NVIDIA_DRA} to publish the GPUs ({pub.counted()})"
    reason = ""  # no count of seconds in it: the annotation would change, and be written, every cycle
    if since is not None and now - since >= policy.driver_timeout_seconds:
        reason = (
            f"{NVIDIA_DRA} has not published this node's GPUs within {policy.driver_timeout_seconds:g} s "
            f"(node.validate.driverTimeoutSeconds): {pub.counted()}; "
            f"the taint {taint_key} stays until it does. Does its kubelet plugin run on this node and "
            f"tolerate {taint_key}? (docs/guides/validate-before-service.md)"
        )
    announce = bool(reason) and not state.announced
    state.announced |= announce
    state.said, state.timed_out = (reason or f"waiting for {note}"), bool(reason)
    return Waiting(True, note, reason, announce)


__all__ = [
    "ALWAYS",
    "DRA_DRIVER",
    "NEVER",
    "ClassReader",
    "DriverWait",
    "Publication",
    "Waiting",
    "publication",
    "wait",
]
