"""`gpu-healthcheck inject kmsg`: write a realistic NVRM Xid line into the kernel log (/dev/kmsg).

Exercises the kernel-log path end to end (xid tier → finding → Node marks). Needs root/CAP_SYSLOG on the
node and --yes: every reader of the kernel log (other agents, log shippers) sees the line.
"""

from __future__ import annotations

import re
from pathlib import Path

# Texts as the driver prints them (xid-kernel-log fixtures; NVIDIA Xid catalog).
_TEXTS = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x0_00000000",
    43: "Ch 00000008",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x0",
    63: "Row Remapper: New row (0x0000000000000000) marked for remapping, reset gpu to activate.",
    74: "NVLink: fatal error detected on link 0(0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
}
_PCI = re.compile(r"^(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?$")


class InjectRefused(RuntimeError):
    """Not confirmed with --yes, or bad arguments."""


def xid_line(xid: int, pci: str) -> str:
    """`NVRM: Xid (PCI:0000:53:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.`"""
    if not _PCI.match(pci):
        raise InjectRefused(f"not a PCI address: {pci!r} (expected e.g. 0000:53:00.0)")
    bus = pci if pci.count(":") == 2 else f"0000:{pci}"
    bus = bus.rsplit(".", 1)[0]  # the driver prints domain:bus:device, no function
    text = _TEXTS.get(xid, "Injected by gpu-healthcheck for an end-to-end test")
    return f"NVRM: Xid (PCI:{bus.lower()}): {xid}, pid='<unknown>', name=<unknown>, {text}"


def write_xid_line(path: str | Path, xid: int, pci: str, yes: bool) -> str:
    """Write one Xid line (kernel priority 4, warning) to `path` (normally /dev/kmsg); return the line.

    Raises InjectRefused without yes=True or on bad arguments; OSError if the write fails."""
    if not yes:
        raise InjectRefused("refusing to write into the kernel log without --yes (every log reader sees it)")
    if xid <= 0 or xid > 65535:
        raise InjectRefused(f"not an Xid code: {xid}")
    line = xid_line(xid, pci)
    with open(path, "w", encoding="utf-8") as fh:  # /dev/kmsg: one write() = one record
        fh.write(f"<4>{line}\n")
    return line
