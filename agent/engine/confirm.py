"""One slow read is not a broken GPU: a finding of a rule a transient can trip (Rule.confirm: a tool
or NVML read that timed out, a driver the tool could not reach, a port caught retraining) fails the
node only once its check found it in `node.confirmAfter` consecutive runs.

Until then the finding is held back and its check is `unknown` ("failing run 1 of 2, confirming"):
an unknown check never fails the node, never marks it, and never clears a mark (the taint's
recovery count freezes on it). A run of the check without the finding ends its streak. A finding
confirmed once stays confirmed while its streak lasts, whatever confirmAfter becomes on a reload;
a check that was failing when the agent restarted (same boot, the results annotation) has its
findings confirmed at its first run, so a restart neither delays nor flaps a failure.

Findings below `reset` are never held back: they only warn, and a warning marks nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from agent.core.findings import CheckResult, Finding
from agent.core.rules import Rule
from agent.core.severity import Severity

CONFIG_KEY = "node.confirmAfter"


@dataclass
class Confirmations:
    """Per check, per finding key: the consecutive runs that found it, and which are confirmed."""

    streaks: dict[str, dict[str, int]] = field(default_factory=dict)
    confirmed: dict[str, set[str]] = field(default_factory=dict)
    carried: set[str] = field(default_factory=set)  # failing checks restored after an agent restart

    def restore(self, failing_checks: Iterable[str]) -> None:
        """The checks the results annotation of this boot shows failing: confirmed at their next run."""
        self.carried = set(failing_checks)

    def pending(self) -> dict[str, int]:
        """Finding key -> consecutive runs so far, for findings not yet confirmed."""
        return {
            key: n
            for check, keys in self.streaks.items()
            for key, n in keys.items()
            if key not in self.confirmed.get(check, set())
        }

    def judge(
        self, results: Sequence[CheckResult], confirm_after: int, rules: Mapping[str, Rule]
    ) -> list[CheckResult]:
        """This run's results, with the findings that need confirmation and do not have it yet held
        back (their check `unknown`, saying so). Advances each check's streaks."""
        return [self._judge_one(res, confirm_after, rules) for res in results]

    def _judge_one(self, res: CheckResult, confirm_after: int, rules: Mapping[str, Rule]) -> CheckResult:
        before = self.streaks.get(res.name, {})
        was_confirmed = self.confirmed.get(res.name, set())
        carried = res.name in self.carried
        self.carried.discard(res.name)
        streaks: dict[str, int] = {}
        confirmed: set[str] = set()
        kept: list[Finding] = []
        held: list[str] = []
        for f in res.findings:
            rule = rules.get(f.rule)
            if rule is None or not rule.confirm or f.severity < Severity.RESET:
                kept.append(f)
                continue
            key = f.key or f.rule
            runs = streaks[key] = before.get(key, 0) + 1
            if carried or key in was_confirmed or runs >= confirm_after:
                confirmed.add(key)
                kept.append(f)
            else:
                held.append(
                    f"{f.message} (failing run {runs} of {confirm_after}, confirming before it counts: "
                    f"{CONFIG_KEY})"
                )
        self.streaks[res.name], self.confirmed[res.name] = streaks, confirmed
        if not held:
            return res
        unknown = "; ".join(held) if res.unknown is None else f"{res.unknown}; {'; '.join(held)}"
        return replace(res, findings=tuple(kept), unknown=unknown)
