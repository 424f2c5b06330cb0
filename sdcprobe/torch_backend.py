"""The SDC probe on the GPUs: cuBLAS GEMMs and CUDA reductions through torch, deterministic.

torch (the probe image's one dependency beyond the CUDA runtime) gives cuBLAS GEMMs in every
precision the tensor cores run (FP64, FP32 with TF32 off, TF32, BF16, FP16; FP8 E4M3 by
`_scaled_mm` on GPUs with compute capability 8.9 or later) and reductions, with a deterministic
mode: `torch.use_deterministic_algorithms(True)` and CUBLAS_WORKSPACE_CONFIG set before CUDA starts,
so one GPU model on one software stack gives the same bytes for the same inputs, run after run.
Imported only in the probe's image (Dockerfile.sdcprobe); the agent's image has no CUDA.

Inputs: generated once on the host from the fixed seed (float64, uniform in [-1, 1)), converted
to each precision on the host, copied to each GPU. *repeats*: each kernel runs that many times per
attempt and every output goes into its digest (more work on the chip, the same comparison).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from sdcprobe.backend import Device

DTYPES = {"fp64": "float64", "fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}


class TorchBackend:
    name = "torch"

    def __init__(self, repeats: int = 1) -> None:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts
        self.torch: Any = importlib.import_module("torch")
        self.torch.use_deterministic_algorithms(True)
        self.repeats = max(1, repeats)

    def devices(self) -> list[Device]:
        t = self.torch
        out = []
        for i in range(int(t.cuda.device_count())):
            p = t.cuda.get_device_properties(i)
            uuid = str(getattr(p, "uuid", "") or "")
            pci = ""
            if hasattr(p, "pci_bus_id"):
                domain = int(getattr(p, "pci_domain_id", 0))
                pci = f"{domain:08x}:{int(p.pci_bus_id):02x}:{int(p.pci_device_id):02x}.0"
            out.append(
                Device(i, f"GPU-{uuid}" if uuid and not uuid.startswith("GPU-") else uuid, pci, str(p.name))
            )
        return out

    def precisions(self, device: Device) -> tuple[str, ...]:
        major, minor = self.torch.cuda.get_device_capability(device.index)
        fp8 = (major, minor) >= (8, 9) and hasattr(self.torch, "float8_e4m3fn")
        return (*DTYPES, "fp8") if fp8 else tuple(DTYPES)

    def inputs(self, seed: int, size: int) -> dict[str, Any]:
        t = self.torch
        g = t.Generator().manual_seed(seed)
        a = t.rand((size, size), generator=g, dtype=t.float64) * 2 - 1
        b = t.rand((size, size), generator=g, dtype=t.float64) * 2 - 1
        host = {p: (a.to(getattr(t, d)), b.to(getattr(t, d))) for p, d in DTYPES.items()}
        if hasattr(t, "float8_e4m3fn"):
            host["fp8"] = (a.float().to(t.float8_e4m3fn), b.float().to(t.float8_e4m3fn))
        return host

    def compute(self, device: Device, kernel: str, precision: str, inputs: Any) -> bytes:
        t = self.torch
        dev = t.device("cuda", device.index)
        with t.cuda.device(dev):
            t.backends.cuda.matmul.allow_tf32 = precision == "tf32"
            t.backends.cudnn.allow_tf32 = precision == "tf32"
            a, b = (x.to(dev) for x in inputs[precision])
            outs = []
            for _ in range(self.repeats):
                if kernel == "gemm" and precision == "fp8":
                    one = t.tensor(1.0, device=dev)
                    got = t._scaled_mm(
                        a, b.t().contiguous().t(), scale_a=one, scale_b=one, out_dtype=t.bfloat16
                    )
                    outs.append(got[0] if isinstance(got, tuple) else got)
                elif kernel == "gemm":
                    outs.append(a @ b)
                elif kernel == "reduce":
                    outs.append((a.to(t.bfloat16) if precision == "fp8" else a).sum(dim=1))
                else:
                    raise ValueError(f"unknown kernel {kernel!r}")
            t.cuda.synchronize(dev)
            return b"".join(bytes(o.cpu().contiguous().view(t.uint8).numpy()) for o in outs)


__all__ = ["TorchBackend"]
