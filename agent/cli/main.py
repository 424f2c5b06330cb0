"""The `gpu-healthcheck` command line: each command's handler (the parser: cli/parser.py)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence

from agent.checks.registry import RULE_BOOK, RULES, after_checks, needed_inputs, run_checks, select
from agent.cli.parser import EXIT_USAGE, build_parser
from agent.cli.render import explain, table
from agent.cli.status import EXIT_UNAVAILABLE
from agent.config import Config, load_config_dir
from agent.config.schema import ConfigError
from agent.core import trend_history
from agent.core.facts import Input
from agent.core.results_doc import now_iso, results_document
from agent.core.severity import Status
from agent.engine.confirm import Confirmations
from agent.engine.gpu_verdicts import gpu_verdicts
from agent.engine.verdict import decide
from agent.probes.live import LiveSource
from agent.probes.snapshot import SnapshotError, SnapshotSource
from agent.probes.source import Source, gather_facts
from agent.probes.tool_outputs import SNAPSHOT_FILES

EXIT_CODES = {Status.PASS: 0, Status.WARN: 0, Status.FAIL: 1, Status.UNKNOWN: 2}


class UsageError(Exception):
    pass


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
        source = LiveSource(tool_timeouts(cfg, args.timeout))
    inputs = needed_inputs(specs) | {Input.NODE}
    facts = gather_facts(source, cfg, instance_type=args.instance_type, only=lambda i: i in inputs)
    # As the agent judges its first run: a finding a transient can trip (a tool that timed out) is
    # held back until node.confirmAfter runs found it, so `check` says "failing run 1 of 2,
    # confirming" (unknown, exit 2) where the agent would, not a failure the agent would not mark.
    results = Confirmations().judge(run_checks(specs, facts, cfg), cfg.node.confirm_after, RULES)
    verdict = decide(after_checks(results))
    if args.json:
        doc = results_document(
            verdict,
            checked_at=now_iso(),
            boot_id=facts.boot_id,
            instance_type=facts.instance_type,
            gpus=gpu_verdicts(verdict.results, facts.gpus, verdict.status, dra=facts.dra),
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


def tool_timeouts(cfg: Config, timeout_s: float | None) -> Config:
    """The config `check` reads the node with: --timeout bounds nvidia-smi and NVML alike; without it,
    each keeps its own (timeouts.nvidiaSmi, timeouts.nvml), as the agent reads them."""
    if timeout_s is None:
        return cfg
    timeouts = {**cfg.raw["timeouts"], "nvidiaSmi": timeout_s, "nvml": timeout_s}
    return dataclasses.replace(cfg, raw={**cfg.raw, "timeouts": timeouts})


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


def cmd_diag(args: argparse.Namespace) -> int:
    from agent.cli.agent import kube_core
    from agent.cli.clear import ClearUsageError, kubeconfig_user, whoami
    from agent.cli.diag import request_diag

    if not args.reason.strip():
        raise UsageError("--reason: say why (it is kept with who asked)")
    if args.wait < 0:
        raise UsageError("--wait: seconds, 0 or more")
    try:
        rest = kube_core(args.kubeconfig)
        who = whoami(rest, lambda: kubeconfig_user(args.kubeconfig))
        outcome = request_diag(
            rest,
            args.node,
            prefix=args.prefix,
            reason=args.reason.strip(),
            who=who,
            level=args.level,
            wait_s=args.wait,
        )
    except ClearUsageError as exc:
        raise UsageError(str(exc)) from exc
    except Exception as exc:  # no cluster, no permission: one clear line
        print(
            f"gpu-healthcheck: cannot ask {args.node} for a diag: {type(exc).__name__}: {exc}",
            file=sys.stderr,
        )
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


def cmd_uninstall(args: argparse.Namespace) -> int:
    from agent.cli.agent import kube_core
    from agent.cli.uninstall import uninstall

    try:
        return uninstall(
            kube_core(args.kubeconfig),
            prefix=args.prefix,
            extra_types=args.condition_type,
            namespace=args.namespace,
            agent_selector=args.agent_selector,
            dry_run=args.dry_run,
            force=args.force,
            say=lambda line: print(line, flush=True),
        )
    except Exception as exc:  # no cluster, no permission to list: one clear line
        print(f"gpu-healthcheck: cannot uninstall: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE


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
        cfg = load_config_dir(args.dir, rules=RULE_BOOK)
    except ConfigError as exc:
        print(f"{args.dir}: invalid: {exc}", file=sys.stderr)
        return EXIT_CODES[Status.FAIL]
    missing = [name for name in CONFIG_FILES if not (args.dir / name).is_file()]
    shipped = f" (shipped: {', '.join(missing)})" if missing else ""
    if cfg.ignored:  # written for a newer schema: what this version would leave out
        shipped += f" (schemaVersion {cfg.schema_version}: ignored by this version: {', '.join(cfg.ignored)})"
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
        "diag": cmd_diag,
        "brake": cmd_brake,
        "uninstall": cmd_uninstall,
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
