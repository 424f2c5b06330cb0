"""The compute behind the SDC probe: a Backend runs one kernel in one precision on one device over
inputs generated once on the host from a fixed seed, and returns the output's bytes.

KERNELS: `gemm` (C = A·B, the tensor cores' and cuBLAS's path) and `reduce` (the row sums of A,
the reduction kernels' path). PRECISIONS: FP64, FP32 (TF32 off), TF32, BF16, FP16, FP8 (E4M3, where
the GPU has it); a backend says which it runs on a device. CpuBackend is the tests' stand-in for
the GPUs (pure Python, small, deterministic), with the fault injected at its lowest layer: one bit
of one device's output flipped on chosen attempts. TorchBackend (torch_backend.py) runs on CUDA and
is imported only in the probe's image.
"""

from __future__ import annotations

import random
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

KERNELS = ("gemm", "reduce")
PRECISIONS = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8")


@dataclass(frozen=True)
class Device:
    """One GPU as the probe names it: its index in this process, and what the agent matches it by."""

    index: int
    uuid: str
    pci_bus_id: str
    name: str


class Backend(Protocol):
    name: str

    def devices(self) -> list[Device]: ...
    def precisions(self, device: Device) -> tuple[str, ...]: ...
    def inputs(self, seed: int, size: int) -> Any: ...
    def compute(self, device: Device, kernel: str, precision: str, inputs: Any) -> bytes: ...


def _fp32(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def _bits(x: float) -> int:
    return int(struct.unpack("<I", struct.pack("<f", x))[0])


def _from_bits(b: int) -> float:
    return float(struct.unpack("<f", struct.pack("<I", b & 0xFFFFFFFF))[0])


ROUND: dict[str, Callable[[float], float]] = {
    "fp64": float,
    "fp32": _fp32,
    "tf32": lambda x: _from_bits(_bits(x) & ~0x1FFF),  # a 10-bit mantissa
    "bf16": lambda x: _from_bits(_bits(x) & ~0xFFFF),  # a 7-bit mantissa
    "fp16": lambda x: float(struct.unpack("<e", struct.pack("<e", x))[0]),
}


@dataclass
class CpuBackend:
    """*count* stand-in GPUs of one model; *flips*: device index → the attempts (1, 2) on which one
    bit of its `flip_key` output is flipped (a corrupted device); *delay_s*: each compute takes at
    least this long (a run long enough to abort)."""

    count: int = 8
    flips: dict[int, set[int]] = field(default_factory=dict)
    flip_key: tuple[str, str] = ("gemm", "fp32")
    flip_byte: int = 0
    delay_s: float = 0.0
    name: str = "cpu"
    _calls: dict[tuple[int, str, str], int] = field(default_factory=dict)

    def devices(self) -> list[Device]:
        return [
            Device(
                i, f"GPU-00000000-0000-0000-0000-{i:012x}", f"00000000:{0x18 + i:02x}:00.0", "CPU stand-in"
            )
            for i in range(self.count)
        ]

    def precisions(self, device: Device) -> tuple[str, ...]:
        return tuple(p for p in PRECISIONS if p in ROUND)  # no FP8 on the stand-in

    def inputs(self, seed: int, size: int) -> tuple[list[list[float]], list[list[float]]]:
        rng = random.Random(seed)
        a = [[rng.uniform(-1.0, 1.0) for _ in range(size)] for _ in range(size)]
        b = [[rng.uniform(-1.0, 1.0) for _ in range(size)] for _ in range(size)]
        return a, b

    def compute(self, device: Device, kernel: str, precision: str, inputs: Any) -> bytes:
        if self.delay_s:
            time.sleep(self.delay_s)
        r = ROUND[precision]
        a = [[r(x) for x in row] for row in inputs[0]]
        if kernel == "gemm":
            b = [[r(x) for x in row] for row in inputs[1]]
            cols = list(zip(*b, strict=True))
            out = [r(sum(x * y for x, y in zip(row, col, strict=True))) for row in a for col in cols]
        elif kernel == "reduce":
            out = [r(sum(row)) for row in a]
        else:
            raise ValueError(f"unknown kernel {kernel!r}")
        raw = bytearray(struct.pack(f"<{len(out)}d", *out))
        key = (device.index, kernel, precision)
        self._calls[key] = attempt = self._calls.get(key, 0) + 1
        if (kernel, precision) == self.flip_key and attempt in self.flips.get(device.index, set()):
            raw[self.flip_byte % len(raw)] ^= 0x01  # one bit of one device's output: the fault
        return bytes(raw)


def parse_flips(text: str) -> dict[int, set[int]]:
    """`3:1,2;5:1` → {3: {1, 2}, 5: {1}} (the stand-in's --inject)."""
    out: dict[int, set[int]] = {}
    for part in filter(None, text.split(";")):
        dev, _, attempts = part.partition(":")
        out[int(dev)] = {int(a) for a in attempts.split(",") if a}
    return out


__all__ = ["KERNELS", "PRECISIONS", "Backend", "CpuBackend", "Device", "parse_flips"]
