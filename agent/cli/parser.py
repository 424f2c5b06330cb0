"""The `gpu-healthcheck` command line's grammar: its commands, their flags and help, and a usage error's
exit code. The handlers are in cli/main.py."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from agent import __version__
from agent.cli.status import AGENT_SELECTOR
from agent.cli.status import FORMATS as STATUS_FORMATS
from agent.core.node_keys import DEFAULT_PREFIX

EXIT_USAGE = 64
DEFAULT_STATE_DIR = Path("/tmp/gpu-healthcheck")  # the agent pod's own emptyDir (/tmp)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="gpu-healthcheck", description="Find broken GPUs and GPU-network adapters.")
    p.add_argument("--version", action="version", version=f"gpu-healthcheck {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    c = sub.add_parser("check", help="judge this node (or a snapshot) once and print the verdict")
    c.add_argument("--from-snapshot", metavar="DIR", type=Path, help="judge a recorded node snapshot")
    c.add_argument(
        "--instance-type", metavar="T", help="instance type (default: Node label, config, snapshot)"
    )
    c.add_argument("--only", metavar="CHECKS", help="comma-separated checks or groups (e.g. gpu,xid)")
    c.add_argument("--json", action="store_true", help="print the results annotation JSON")
    c.add_argument(
        "--explain",
        action="store_true",
        help="for each finding, the input lines it rests on (file, line, text); why a check is unknown",
    )
    c.add_argument(
        "--config-dir", metavar="DIR", type=Path, help="config directory (default: shipped config)"
    )
    c.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="per-tool timeout in seconds, NVML included (live; default: timeouts.*)",
    )

    s = sub.add_parser("snapshot", help="record this node's tool outputs into DIR")
    s.add_argument("dir", type=Path)
    s.add_argument("--instance-type", metavar="T")
    s.add_argument("--timeout", type=float, default=30.0)
    s.add_argument("--sys-root", type=Path, default=Path("/sys"))
    s.add_argument("--kmsg", default="/dev/kmsg")

    a = sub.add_parser("agent", help="run the node agent (the DaemonSet process)")
    a.add_argument("--node", help="this Node's name (default: $NODE_NAME)")
    a.add_argument("--from-snapshot", metavar="DIR", help="judge a snapshot directory, re-read every tick")
    a.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, then $KUBECONFIG)")
    a.add_argument(
        "--service-account-dir",
        type=Path,
        help="in-cluster: the service account's token and ca.crt "
        "(default: the kubelet's mount, /var/run/secrets/kubernetes.io/serviceaccount)",
    )
    a.add_argument("--config-dir", type=Path, help="config directory (default: /etc/gpu-healthcheck)")
    a.add_argument(
        "--canary-config-dir",
        type=Path,
        help="the canary ConfigMap's directory, run while the Node is labelled "
        "gpu-healthcheck/config=canary (default: /etc/gpu-healthcheck-canary when mounted)",
    )
    a.add_argument(
        "--state-dir",
        type=Path,
        default=DEFAULT_STATE_DIR,
        help="where the last good config is kept, to start on it under an invalid one "
        f"(default: {DEFAULT_STATE_DIR}, the pod's emptyDir)",
    )
    a.add_argument("--metrics-port", type=int, default=None, help="metrics/health port (default: config)")
    a.add_argument(
        "--dry-run", action="store_true", help="judge and log what would be written; write nothing"
    )
    a.add_argument("--no-kube", action="store_true", help="no API server at all: log the marks only")
    a.add_argument("--once", action="store_true", help="run every tier once, write, and exit")

    st = sub.add_parser(
        "status",
        help="the GPU nodes' health marks and the age of their last check "
        "(exit 0 all pass/warn, 1 a node fails, 2 a node could not be judged, 69 no cluster)",
    )
    st.add_argument("node", metavar="NODE", nargs="?", help="this node only")
    st.add_argument("--history", action="store_true", help="NODE's last transitions (its history annotation)")
    st.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, then $KUBECONFIG)")
    st.add_argument(
        "--selector",
        action="append",
        metavar="LABELS",
        help="GPU nodes: a label selector, repeatable, any one matches "
        "(default: the shipped node.gpuNodeSelector and profile instance types, as the agent)",
    )
    st.add_argument("--prefix", default=DEFAULT_PREFIX, help="the agents' config `prefix`")
    st.add_argument("--agent-selector", default=AGENT_SELECTOR, help="the agent pods' labels (any namespace)")
    st.add_argument("-o", "--output", choices=STATUS_FORMATS, default="table", help="output format")

    cl = sub.add_parser(
        "clear",
        help="clear a node's latched findings, audited (who and why); refused while a check still "
        "fails unless --force (exit 0 done, 1 refused, 2 cannot judge, 64 usage, 69 no cluster)",
    )
    cl.add_argument("node", metavar="NODE")
    which = cl.add_mutually_exclusive_group()
    which.add_argument(
        "--latch",
        action="append",
        metavar="KEY",
        help="a latch key as in the results annotation's `latched` list (repeatable)",
    )
    which.add_argument("--all", action="store_true", help="every latched finding (the default)")
    cl.add_argument("--reason", required=True, help="why: kept with who asked, in the agent's Event")
    cl.add_argument("--force", action="store_true", help="clear although another check still fails")
    cl.add_argument(
        "--wait",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="wait this long for the agent to act on it (0: do not wait; default 30)",
    )
    cl.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, then $KUBECONFIG)")
    cl.add_argument("--prefix", default=DEFAULT_PREFIX, help="the agents' config `prefix`")

    dg = sub.add_parser(
        "diag",
        help="ask for a DCGM diag at the next idle window on NODE, audited (who and why) "
        "(exit 0 asked/started, 2 not started within --wait, 64 usage, 69 no cluster)",
    )
    dg.add_argument("node", metavar="NODE")
    dg.add_argument("--reason", required=True, help="why: kept with who asked, in the agent's Event")
    dg.add_argument(
        "--level", type=int, choices=(1, 2, 3, 4), help="the diag level (default: dcgm.diagLevel)"
    )
    dg.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait this long for the diag to start (default 0: do not wait)",
    )
    dg.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, then $KUBECONFIG)")
    dg.add_argument("--prefix", default=DEFAULT_PREFIX, help="the agents' config `prefix`")

    br = sub.add_parser(
        "brake",
        help="the repair budget and wave hold (docs/clusters/node-repair.md: Repair budget and wave hold)",
    )
    br_sub = br.add_subparsers(dest="action", required=True, parser_class=_Parser)
    rel = br_sub.add_parser(
        "release",
        help="lift a wave hold (--key) or every hold and the budget's window, audited (who and why)",
    )
    rel.add_argument("--key", default="", metavar="KEY", help="a finding key, e.g. xid/79 (default: all)")
    rel.add_argument("--reason", required=True, help="why: kept with who asked, in the release record")
    rel.add_argument("--namespace", default="gpu-healthcheck", help="the agents' namespace")
    rel.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, then $KUBECONFIG)")
    rel.add_argument("--prefix", default=DEFAULT_PREFIX, help="the agents' config `prefix`")
    sw = br_sub.add_parser(
        "sweep",
        help="delete the records no agent may delete: old marks and releases, fail records of gone Nodes",
    )
    sw.add_argument(
        "--older-than-hours",
        type=float,
        default=24.0,
        help="delete marks older than this (at least node.repairBudget.windowMinutes; default 24)",
    )
    sw.add_argument("--namespace", default="gpu-healthcheck", help="the agents' namespace")
    sw.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, then $KUBECONFIG)")
    sw.add_argument("--prefix", default=DEFAULT_PREFIX, help="the agents' config `prefix`")

    un = sub.add_parser(
        "uninstall",
        help="remove every label, annotation, taint and condition of ours from every Node, once the "
        "agents are stopped (exit 0 done, 1 agents still run, 2 a Node not cleaned, 64 usage, 69 no cluster)",
    )
    un.add_argument("--dry-run", action="store_true", help="list what it would remove; write nothing")
    un.add_argument("--force", action="store_true", help="clean although agent pods are still listed")
    un.add_argument(
        "--prefix", default=None, help="the agents' config `prefix` (default: the ConfigMap's, or shipped)"
    )
    un.add_argument(
        "--condition-type",
        action="append",
        default=[],
        metavar="TYPE",
        help="also remove this condition type, whatever its reason (repeatable; the ConfigMap's "
        "node.conditionType and node.remediationConditions are read from the cluster)",
    )
    un.add_argument("--namespace", default="gpu-healthcheck", help="the agents' namespace (its ConfigMaps)")
    un.add_argument("--agent-selector", default=AGENT_SELECTOR, help="the agent pods' labels (any namespace)")
    un.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, then $KUBECONFIG)")

    inj = sub.add_parser("inject", help="fault injection for end-to-end tests (test nodes only)")
    inj_sub = inj.add_subparsers(dest="target", required=True, parser_class=_Parser)
    km = inj_sub.add_parser("kmsg", help="write a realistic NVRM Xid line into the kernel log")
    km.add_argument("--xid", type=int, required=True)
    km.add_argument("--gpu", required=True, metavar="PCI_ID", help="e.g. 0000:53:00.0")
    km.add_argument("--kmsg", default="/dev/kmsg")
    km.add_argument("--yes", action="store_true", help="required: every reader of the kernel log sees it")

    sub.add_parser("rules", help="list the severity rules and their defaults")

    cf = sub.add_parser("config", help="the configuration directory (the ConfigMap)")
    cf_sub = cf.add_subparsers(dest="action", required=True, parser_class=_Parser)
    v = cf_sub.add_parser(
        "validate",
        help="check a config directory the way the agent loads it (exit 0 valid, 1 invalid)",
    )
    v.add_argument("dir", type=Path, help="the directory (config.yaml and the tables)")
    return p
