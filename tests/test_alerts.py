"""The alerts (manifests/optional/prometheusrule.yaml): `promtool check rules` accepts them, each has a
`promtool test rules` unit test (tests/alerts/alerts.test.yaml) that makes it fire for the failing
series and not for the healthy ones, each carries a `runbook_url` to a section of docs/guides/alerts.md,
and the chart renders the same rules. promtool is built from Go modules (scripts/build-promtool.sh),
as helm and the Kubernetes test binaries are."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.config import yaml_safe
from tests.kubeenv.binaries import built_go_tool
from tests.test_helm_chart import helm, render  # noqa: F401  (helm: fixture)

ROOT = Path(__file__).parent.parent
RULES = ROOT / "manifests" / "optional" / "prometheusrule.yaml"
TESTS = ROOT / "tests" / "alerts"
RUNBOOKS = ROOT / "docs" / "guides" / "alerts.md"  # the runbooks (in the README before the docs site)


def rule_doc() -> dict[str, Any]:
    return yaml_safe.load(RULES.read_text())  # type: ignore[no-any-return]


def alerts() -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in rule_doc()["spec"]["groups"] for r in g["rules"] if "alert" in r}


def slug(heading: str) -> str:
    """The anchor GitHub (and most Markdown renderers) give a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors() -> set[str]:
    return {slug(m) for m in re.findall(r"^#{1,6} (.+)$", RUNBOOKS.read_text(), re.M)}


@pytest.fixture(scope="session")
def promtool() -> str:
    return built_go_tool("build-promtool.sh")


def test_every_alert_links_a_runbook_section_of_the_docs() -> None:
    found = anchors()
    assert len(alerts()) >= 14
    for name, rule in alerts().items():
        url = rule["annotations"].get("runbook_url", "")
        assert url == f"docs/guides/alerts.md#{name.lower()}", name
        assert url.split("#", 1)[1] in found, f"{name}: no runbook section {url}"


def test_the_runbook_check_finds_a_missing_section() -> None:
    assert "gpunodefailing" in anchors() and "no-such-alert" not in anchors()
    assert slug("Alerts and runbooks") == "alerts-and-runbooks"


def test_every_alert_has_a_unit_test_that_fires_it() -> None:
    doc = yaml_safe.load((TESTS / "alerts.test.yaml").read_text())
    fired = {t["alertname"] for case in doc["tests"] for t in case["alert_rule_test"] if t.get("exp_alerts")}
    quiet = {
        t["alertname"] for case in doc["tests"] for t in case["alert_rule_test"] if not t.get("exp_alerts")
    }
    assert fired == set(alerts()) and quiet == set(alerts())


def test_promtool_checks_and_unit_tests_the_rules(promtool: str, tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_doc()["spec"]))  # the CR's spec: a rule file
    for f in TESTS.glob("*.test.yaml"):
        shutil.copy(f, tmp_path / f.name)
    check = subprocess.run(
        [promtool, "check", "rules", str(tmp_path / "rules.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in check.stdout + check.stderr
    files = sorted(str(p) for p in tmp_path.glob("*.test.yaml"))
    proc = subprocess.run([promtool, "test", "rules", *files], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_unit_test_fails_when_the_wrong_node_is_expected(promtool: str, tmp_path: Path) -> None:
    """promtool compares the firing alerts exactly: expecting the healthy node fails."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_doc()["spec"]))
    text = (TESTS / "alerts.test.yaml").read_text()
    (tmp_path / "bad.test.yaml").write_text(text.replace("node: gpu-a", "node: gpu-b"))
    proc = subprocess.run(
        [promtool, "test", "rules", str(tmp_path / "bad.test.yaml")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0 and "FAILED" in proc.stdout + proc.stderr


def test_the_chart_renders_the_same_rules_and_a_runbook_base(helm: str) -> None:  # noqa: F811
    def rule(*sets: str) -> dict[str, Any]:
        docs = render(helm, "monitoring.enabled=true", *sets)
        return next(d for d in docs if d["kind"] == "PrometheusRule")

    assert rule() == rule_doc()
    based = rule("monitoring.runbookBaseURL=https://git.example.com/ghc/blob/v1/")
    urls = {r["annotations"]["runbook_url"] for g in based["spec"]["groups"] for r in g["rules"]}
    base = "https://git.example.com/ghc/blob/v1/docs/guides/alerts.md"
    assert urls == {f"{base}#{a.lower()}" for a in alerts()}


def ksm_label(key: str) -> str:
    """The Prometheus label kube-state-metrics gives a Kubernetes label in kube_node_labels
    (internal/store/utils.go labelName: "label_" + snake case of the key, [^a-zA-Z0-9_] → "_")."""
    snake = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", re.sub(r"[^a-zA-Z0-9_]", "_", key))
    return "label_" + snake.lower()


def test_gpu_node_without_agent_knows_a_gpu_node_by_every_label_the_selection_uses() -> None:
    """A DRA-only node has no nvidia.com/gpu: the alert finds it by the GPU-node labels of
    core/gpu_nodes.py (one matcher each, as kube_node_labels spells it), and its runbook names each
    label for kube-state-metrics' --metric-labels-allowlist (without it the series has no such
    label and the matcher finds nothing)."""
    from agent.core.gpu_nodes import DEFAULT_GPU_NODE_SELECTORS, parse_selector

    wanted = set()
    for selector in DEFAULT_GPU_NODE_SELECTORS:
        (req,) = parse_selector(selector)
        wanted.add(f'{ksm_label(req.key)}="{req.values[0]}"' if req.values else f'{ksm_label(req.key)}!=""')
    expr = alerts()["GPUNodeWithoutAgent"]["expr"]
    assert set(re.findall(r"kube_node_labels\{([^}]*)\}", expr)) == wanted
    assert 'kube_node_status_capacity{resource="nvidia_com_gpu"}' in expr  # device-plugin nodes too
    allow = re.search(r"--metric-labels-allowlist=nodes=\[([^\]]*)\]", RUNBOOKS.read_text())
    assert allow is not None
    keys = {parse_selector(s)[0].key for s in DEFAULT_GPU_NODE_SELECTORS}
    assert set(allow.group(1).split(",")) == keys
    assert ksm_label("feature.node.kubernetes.io/pci-0302_10de.present") == (
        "label_feature_node_kubernetes_io_pci_0302_10de_present"
    )
