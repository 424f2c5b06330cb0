"""`python -m sdcprobe run|serve`: one probe run (its report on stdout or --out), or the node's
HTTP server (server.py) that runs one per request."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sdcprobe.backend import KERNELS, PRECISIONS, Backend, CpuBackend, parse_flips
from sdcprobe.probe import SEED, Plan, run_probe


def backend_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=("torch", "cpu"), default="torch")
    p.add_argument("--size", type=int, default=None, help="matrix side (torch 4096, cpu 16)")
    p.add_argument("--repeats", type=int, default=1, help="torch: runs of each kernel per attempt")
    p.add_argument("--precisions", default=",".join(PRECISIONS))
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--cpu-devices", type=int, default=8, help="cpu: how many stand-in GPUs")
    p.add_argument("--inject", default="", help="cpu: DEV:ATTEMPT[,ATTEMPT];... flips a bit there")
    p.add_argument("--cpu-delay", type=float, default=0.0, help="cpu: seconds per kernel")


def make(args: argparse.Namespace) -> tuple[Backend, Plan]:
    backend: Backend
    if args.backend == "cpu":
        backend = CpuBackend(count=args.cpu_devices, flips=parse_flips(args.inject), delay_s=args.cpu_delay)
    else:
        from sdcprobe.torch_backend import TorchBackend

        backend = TorchBackend(repeats=args.repeats)
    size = args.size or (16 if args.backend == "cpu" else 4096)
    wanted = tuple(p for p in args.precisions.split(",") if p in PRECISIONS)
    return backend, Plan(seed=args.seed, size=size, kernels=KERNELS, precisions=wanted)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sdcprobe")
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="one probe run; its JSON report on stdout or --out")
    backend_args(run)
    run.add_argument("--out", type=Path, default=None)
    serve = sub.add_parser("serve", help="the node's HTTP API (server.py)")
    backend_args(serve)
    serve.add_argument("--listen", default="127.0.0.1:7436")
    serve.add_argument("--timeout", type=float, default=600.0, help="a run past this is killed")
    args = parser.parse_args(argv)
    if args.cmd == "serve":
        from sdcprobe.server import serve_forever

        return serve_forever(args)
    backend, plan = make(args)
    text = json.dumps(run_probe(backend, plan), sort_keys=True)
    if args.out is not None:
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(args.out)  # whole or absent: the server never reads half a report
    else:
        sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
