"""The quarantine test of one drained node (`python -m agent.cli.quarantine`, run by
manifests/jobs/quarantine-job.yaml): `dcgmi diag -r LEVEL -j` through the node's engine, judged by the
agent's own parser and dcgm-diag check, the outcome written to the Node annotation
`<prefix>/quarantine-result` as {"level", "result", "exitCode", "at", "summary", "findings"}.

result: pass | warn | fail, or error when the diag could not run or its output cannot be read (engine
unreachable, GPUs busy, dcgmi missing or past its timeout): never read an error as a pass.
Exit status: 0 pass/warn, 1 fail, 2 error, 3 the annotation could not be written (also when its
identity is marked to be fenced but the admission fence does not hold it: fail closed).
dcgmi may print a warning line before the JSON document; the parser skips it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent.checks.dcgm import check_dcgm_diag
from agent.cli.agent import ETC_CONFIG, kube_core
from agent.config import Config, load_config_dir
from agent.config.schema import ConfigError
from agent.core.facts import NodeFacts
from agent.core.probed import ParseError
from agent.core.severity import Status
from agent.probes.dcgm.dcgmi import run_dcgmi_diag
from agent.probes.dcgm.diag_json import parse_dcgm_diag_json
from agent.reporters.fence import prove_fence
from agent.reporters.kube_rest import KubeRest

EXIT = {"pass": 0, "warn": 0, "fail": 1, "error": 2}
EXIT_NOT_WRITTEN = 3
MAX_SUMMARY = 500


def judge(level: int, rc: int, output: str, cfg: Config, now: datetime.datetime) -> dict[str, Any]:
    """The annotation document for one run of dcgmi."""
    doc: dict[str, Any] = {
        "level": level,
        "exitCode": rc,
        "at": now.astimezone(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    try:
        report = parse_dcgm_diag_json(output) if rc >= 0 else None
    except ParseError as exc:
        last = output.strip().splitlines()[-1] if output.strip() else "no output"
        return doc | {"result": "error", "summary": f"dcgmi output unreadable ({exc}): {last}"[:MAX_SUMMARY]}
    if report is None:
        return doc | {"result": "error", "summary": output[:MAX_SUMMARY]}
    res = check_dcgm_diag(NodeFacts(dcgm_diag=report), cfg)
    result = {Status.PASS: "pass", Status.WARN: "warn", Status.FAIL: "fail"}.get(res.status, "error")
    if result == "pass" and rc != 0:  # dcgmi failed but printed a passing document: do not trust it
        result = "error"
    summary = res.message if res.status is not Status.PASS else (res.note or res.message)
    return doc | {
        "result": result,
        "summary": summary[:MAX_SUMMARY],
        "findings": [
            {"key": f.key, "severity": f.severity.name.lower(), "message": f.message[:200]}
            for f in res.findings
        ],
    }


def write_annotation(kube: KubeRest, node: str, key: str, doc: dict[str, Any]) -> None:
    """Merge-patch one annotation of our own on the Node (the admission policy fences the Job to it)."""
    body = {"metadata": {"annotations": {key: json.dumps(doc, separators=(",", ":"))}}}
    kube.json("PATCH", f"/api/v1/nodes/{node}", body=body, content_type="application/merge-patch+json")


def main(argv: Sequence[str] | None = None) -> int:
    env = os.environ
    p = argparse.ArgumentParser(prog="python -m agent.cli.quarantine", description=__doc__.splitlines()[0])
    p.add_argument("--node", default=env.get("NODE_NAME", ""), help="the Node to annotate (its own)")
    p.add_argument("--level", type=int, choices=(1, 2, 3, 4), default=int(env.get("DIAG_LEVEL", "3") or 3))
    p.add_argument("--host", default=env.get("DCGM_HOST", "nvidia-dcgm.gpu-healthcheck.svc:5555"))
    p.add_argument("--timeout", type=float, default=float(env.get("DIAG_TIMEOUT", "21000")))
    p.add_argument("--dcgmi", default=env.get("DCGMI", "dcgmi"))
    p.add_argument("--config", default=env.get("GPU_HEALTHCHECK_CONFIG", ""), help="config directory")
    a = p.parse_args(argv)
    if not a.node:
        print("quarantine: no node (set NODE_NAME or --node)", file=sys.stderr)
        return EXIT["error"]
    try:
        cfg = load_config_dir(Path(a.config) if a.config else ETC_CONFIG if ETC_CONFIG.is_dir() else None)
    except ConfigError as exc:
        print(f"quarantine: config unreadable: {exc}", file=sys.stderr)
        return EXIT["error"]
    print(f"quarantine: dcgmi diag -r {a.level} on node {a.node} through {a.host}", flush=True)
    rc, output = run_dcgmi_diag(a.dcgmi, a.host, a.level, a.timeout)
    print(output, flush=True)
    doc = judge(a.level, rc, output, cfg, datetime.datetime.now(datetime.timezone.utc))
    key = f"{cfg.prefix}/quarantine-result"
    try:
        core = kube_core(None)  # in-cluster, else $KUBECONFIG
        proof = prove_fence(core, a.node, cfg.prefix)
        if proof.holds_writes:  # marked to be fenced, yet unfenced: half an install (fail closed)
            why = f"unfenced although marked to be fenced: {proof.detail}"
            print(f"quarantine: not writing {key}: {why}", file=sys.stderr)
            return EXIT_NOT_WRITTEN
        write_annotation(core, a.node, key, doc)
    except Exception as exc:  # the result is still in the log
        print(f"quarantine: could not write {key} on {a.node}: {exc}", file=sys.stderr)
        return EXIT_NOT_WRITTEN
    print(f"{key}: {json.dumps(doc)}", flush=True)
    return EXIT[doc["result"]]


if __name__ == "__main__":
    sys.exit(main())
