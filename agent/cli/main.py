"""The `gpu-healthcheck` command line."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from agent import __version__
from agent.checks.registry import RULE_BOOK, RULES, needed_inputs, run_checks, select
from agent.cli.render import explain, table
from agent.cli.status import AGENT_SELECTOR, EXIT_UNAVAILABLE
from agent.cli.status import FORMATS as STATUS_FORMATS
from agent.config import ConfigError, load_config_dir
from agent.core import trend_history
from agent.core.facts import Input
from agent.core.node_keys import DEFAULT_PREFIX
from agent.core.results_doc import now_iso, results_document
from agent.core.severity import Status
from agent.engine.gpu_verdicts import gpu_verdicts
from agent.engine.verdict import decide
from agent.probes.live import LiveSource
from agent.probes.snapshot import SNAPSHOT_FILES, SnapshotError, SnapshotSource
from agent.probes.source import Source, gather_facts

EXIT_USAGE = 64
DEFAULT_STATE_DIR = Path("/tmp/gpu-healthcheck")  # the agent pod's own emptyDir (/tmp)
EXIT_CODES = {Status.PASS: 0, Status.WARN: 0, Status.FAIL: 1, Status.UNKNOWN: 2}


class UsageError(Exception):
    pass


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
    c.add_argument("--timeout", type=float, default=None, help="per-tool timeout in seconds (live)")

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

    br = sub.add_parser("brake", help="the repair budget and wave hold (README: Repair budget and wave hold)")
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


def cmd_check(args: argparse.Namespace) -> int:
    try:
        cfg = load_config_dir(args.config_dir, rules=RULE_BOOK)
    except ConfigError as exc:
        raise UsageError(f"invalid configuration: {exc}") from exc
    try:
        specs = select(args.only.split(",") if args.only else None, cfg)
    except KeyError as exc:
        raise UsageError(str(exc.args[0])) from exc
    source: Source
    if args.from_snapshot is not None:
        try:
            source = SnapshotSource(args.from_snapshot)
        except SnapshotError as exc:
            raise UsageError(str(exc)) from exc
    else:
        source = LiveSource(
            timeout_s=args.timeout or cfg.timeouts.nvidia_smi, check_timeout_s=cfg.timeouts.check
        )
    inputs = needed_inputs(specs) | {Input.NODE}
    facts = gather_facts(source, cfg, instance_type=args.instance_type, only=lambda i: i in inputs)
    verdict = decide(run_checks(specs, facts, cfg))
    if args.json:
        doc = results_document(
            verdict,
            checked_at=now_iso(),
            boot_id=facts.boot_id,
            instance_type=facts.instance_type,
            gpus=gpu_verdicts(verdict.results, facts.gpus, verdict.status),
            trends=trend_history.to_doc(facts.trends),
        )
        print(json.dumps(doc, indent=2, ensure_ascii=False))
    else:
        print(table(verdict, facts))
    if args.explain:
        files = SNAPSHOT_FILES if args.from_snapshot is not None else None
        # With --json, stdout stays one JSON document.
        print(
            ("\n" if not args.json else "") + explain(verdict, files),
            file=sys.stderr if args.json else sys.stdout,
        )
    return EXIT_CODES[verdict.status]


def cmd_snapshot(args: argparse.Namespace) -> int:
    from agent.probes.capture import capture

    problems = capture(
        args.dir,
        timeout_s=args.timeout,
        sys_root=args.sys_root,
        kmsg_path=args.kmsg,
        instance_type=args.instance_type,
    )
    for name, problem in sorted(problems.items()):
        print(f"snapshot: {name}: {problem}", file=sys.stderr)
    print(f"snapshot written to {args.dir}")
    return 0


def cmd_agent(args: argparse.Namespace) -> int:
    from agent.cli.agent import main as agent_main

    return agent_main(args)


def cmd_status(args: argparse.Namespace) -> int:
    from agent.cli.agent import kube_core
    from agent.cli.status import render_status
    from agent.cli.status_history import read_node, render_history

    if args.history and not args.node:
        raise UsageError("--history: name the node (gpu-healthcheck status NODE --history)")
    try:
        if args.history:
            node = read_node(kube_core(args.kubeconfig), args.node)
            sys.stdout.write(render_history(node, prefix=args.prefix, fmt=args.output))
            return 0
        selectors = tuple(args.selector or load_config_dir(rules=RULE_BOOK).gpu_node_selection)
        core = kube_core(args.kubeconfig)
        out, code = render_status(
            core,
            prefix=args.prefix,
            selectors=selectors,
            agent_selector=args.agent_selector,
            fmt=args.output,
            node=args.node,
        )
    except Exception as exc:  # no cluster, no permission: one clear line
        print(f"gpu-healthcheck: cannot read the cluster: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    sys.stdout.write(out)
    return code


def cmd_clear(args: argparse.Namespace) -> int:
    from agent.cli.agent import kube_core
    from agent.cli.clear import ClearUsageError, clear, kubeconfig_user, whoami

    if not args.reason.strip():
        raise UsageError("--reason: say why (it is kept with who asked)")
    if args.wait < 0:
        raise UsageError("--wait: seconds, 0 or more")
    try:
        rest = kube_core(args.kubeconfig)
        who = whoami(rest, lambda: kubeconfig_user(args.kubeconfig))
        outcome = clear(
            rest,
            args.node,
            prefix=args.prefix,
            latch=args.latch,
            reason=args.reason.strip(),
            force=args.force,
            who=who,
            wait_s=args.wait,
        )
    except ClearUsageError as exc:
        raise UsageError(str(exc)) from exc
    except Exception as exc:  # no cluster, no permission: one clear line
        print(f"gpu-healthcheck: cannot clear {args.node}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    print(outcome.message, file=sys.stdout if outcome.code == 0 else sys.stderr)
    return outcome.code


def cmd_brake(args: argparse.Namespace) -> int:
    from agent.cli.agent import kube_core
    from agent.cli.brake import release, sweep
    from agent.cli.clear import kubeconfig_user, whoami

    if args.action == "sweep":
        if args.older_than_hours <= 0:
            raise UsageError("--older-than-hours: more than 0")
        try:
            said = sweep(
                kube_core(args.kubeconfig),
                namespace=args.namespace,
                prefix=args.prefix,
                older_than_s=args.older_than_hours * 3600,
                now=time.time(),
            )
        except Exception as exc:  # no cluster, no permission: one clear line
            print(f"gpu-healthcheck: cannot sweep: {type(exc).__name__}: {exc}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        print(said)
        return 0
    if not args.reason.strip():
        raise UsageError("--reason: say why (it is kept with who asked)")
    try:
        rest = kube_core(args.kubeconfig)
        who = whoami(rest, lambda: kubeconfig_user(args.kubeconfig))
        said = release(
            rest,
            namespace=args.namespace,
            prefix=args.prefix,
            key=args.key.strip(),
            reason=args.reason.strip(),
            who=who,
        )
    except Exception as exc:  # no cluster, no permission: one clear line
        print(f"gpu-healthcheck: cannot release: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    print(said)
    return 0


def cmd_inject(args: argparse.Namespace) -> int:
    from agent.probes.kmsg_inject import InjectRefused, write_xid_line

    try:
        line = write_xid_line(args.kmsg, args.xid, args.gpu, args.yes)
    except InjectRefused as exc:
        raise UsageError(str(exc)) from exc
    except OSError as exc:
        print(f"gpu-healthcheck: cannot write {args.kmsg}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"wrote: {line}")
    return 0


def cmd_rules(_: argparse.Namespace) -> int:
    for rule in RULES.values():
        confirm = " [confirmed over node.confirmAfter runs]" if rule.confirm else ""
        print(f"{rule.name:<34} {rule.severity.label:<8} {rule.text}{confirm}")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    """`config validate DIR`: the agent's own load (agent.config.load_config_dir with the rule
    registry), so CI and the agent never disagree. A file the directory lacks is the shipped one."""
    from agent.config import CONFIG_FILES

    try:
        load_config_dir(args.dir, rules=RULE_BOOK)
    except ConfigError as exc:
        print(f"{args.dir}: invalid: {exc}", file=sys.stderr)
        return EXIT_CODES[Status.FAIL]
    missing = [name for name in CONFIG_FILES if not (args.dir / name).is_file()]
    shipped = f" (shipped: {', '.join(missing)})" if missing else ""
    print(f"{args.dir}: valid{shipped}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handlers = {
        "check": cmd_check,
        "snapshot": cmd_snapshot,
        "agent": cmd_agent,
        "status": cmd_status,
        "clear": cmd_clear,
        "brake": cmd_brake,
        "inject": cmd_inject,
        "rules": cmd_rules,
        "config": cmd_config,
    }
    try:
        return handlers[args.command](args)
    except UsageError as exc:
        print(f"gpu-healthcheck: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
