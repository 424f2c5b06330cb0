"""The docs site: its reference pages are what scripts/gen-docs.py writes from the code now, and it
builds with mkdocs in strict mode, where a broken link or anchor fails (issue 46)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # mkdocs-material's banner on every build


def gen_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen-docs.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_reference_pages_are_current() -> None:
    done = subprocess.run(
        [sys.executable, "scripts/gen-docs.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_check_fails_on_a_stale_or_missing_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = gen_docs()
    monkeypatch.setattr(mod, "OUT", tmp_path)
    assert mod.main(["--check"]) == 1  # every page missing
    assert mod.main([]) == 0 and mod.main(["--check"]) == 0
    page = tmp_path / "config.md"
    page.write_text(page.read_text(encoding="utf-8").replace("| live |", "| restart |", 1), encoding="utf-8")
    assert mod.main(["--check"]) == 1


def test_check_fails_on_an_anchor_outside_the_site_that_no_heading_makes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mod = gen_docs()
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# x\n\n```sh\n# not a heading\n```\n\n### Upgrade and roll back\n")
    (tmp_path / "DESIGN.md").write_text("## §4 The Node's contract\n")
    page = tmp_path / "docs" / "guide.md"
    page.write_text("`README.md#upgrade-and-roll-back` and `DESIGN.md#4-the-nodes-contract`\n")
    monkeypatch.setattr(mod, "ROOT", tmp_path)
    assert mod.missing_anchors() == []
    page.write_text("`README.md#not-a-heading` `DESIGN.md#the-nodes-contract`\n")
    assert mod.missing_anchors() == [
        "docs/guide.md: README.md#not-a-heading: no such heading",
        "docs/guide.md: DESIGN.md#the-nodes-contract: no such heading",
    ]


def test_meanings_come_from_the_comments_of_config_yaml() -> None:
    said = gen_docs().yaml_comments(
        "# The section.\n"
        "node:\n"
        "  # Above the key,\n"
        "  # two lines.\n"
        "  mode: taint       # after it\n"
        "                    # and its continuation\n"
        "  list: []\n"
        "  #  - type: X      # a commented-out example, no meaning of `next`\n"
        "  next: 1\n"
    )
    assert said == {
        "node": "The section.",
        "node.mode": "Above the key, two lines. after it and its continuation",
    }


def test_every_config_key_is_in_the_reference_with_its_reload() -> None:
    mod = gen_docs()
    page = mod.config_page()
    for path, spec in mod.leaves(mod.schema.SCHEMA):
        if not isinstance(spec, dict):
            live = "restart" if path in mod.schema.RESTART_ONLY else "live"
            assert any(
                line.startswith(f"| `{path}` |") and f"| {live} |" in line for line in page.splitlines()
            )
    # a long comment above a key, with indented continuation lines, is kept whole
    isolation = next(line for line in page.splitlines() if line.startswith("| `node.isolation` |"))
    assert "Where a taint goes" in isolation and "reads `degraded`" in isolation


def test_a_config_key_without_a_comment_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = gen_docs()
    text = (ROOT / "config" / "config.yaml").read_text(encoding="utf-8")
    line = next(x for x in text.splitlines() if x.startswith("configPollSeconds:"))
    bare = tmp_path / "config.yaml"
    bare.write_text(text.replace(line, line.split("#")[0].rstrip()), encoding="utf-8")
    monkeypatch.setattr(mod, "CONFIG_YAML", bare)
    with pytest.raises(SystemExit, match="say what configPollSeconds does"):
        mod.config_page()


def test_a_status_column_without_a_meaning_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = gen_docs()
    assert "WOULD MARK" in mod.status_page()
    monkeypatch.delitem(mod.cli_status.COLUMNS, "WOULD MARK")
    with pytest.raises(SystemExit, match="WOULD MARK"):
        mod.status_page()


def mkdocs_or_skip() -> None:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        if os.environ.get("CI"):
            pytest.fail("mkdocs is not installed: `make setup` installs the `docs` extra")
        pytest.skip("mkdocs and mkdocs-material are not installed: pip install -e '.[docs]'")


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
    )


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    mkdocs_or_skip()
    done = build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "reference" / "config.html").is_file()
    assert "node.isolationNodeAtGpus" in (tmp_path / "site" / "reference" / "config.html").read_text()


def test_a_broken_anchor_fails_the_strict_build(tmp_path: Path) -> None:
    mkdocs_or_skip()
    for name in ("mkdocs.yml", "DESIGN.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    with (tmp_path / "docs" / "testing.md").open("a", encoding="utf-8") as f:
        f.write("\nSee [the keys](reference/config.md#no-such-key).\n")
    done = build(tmp_path, tmp_path / "site")
    assert done.returncode != 0
    assert "does not contain an anchor '#no-such-key'" in done.stdout + done.stderr


def test_the_readme_is_short() -> None:
    """The README says what the product is, the two commands, install and where the docs are; the
    rest lives in docs/ (issue 46: it had grown to 3,064 lines)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    assert "make demo   #" in text and "make test   #" in text  # the two commands, first
    for page in (
        "clusters/device-plugin.md",
        "clusters/dra-only.md",
        "clusters/node-repair.md",
        "install.md",
    ):
        assert f"(docs/{page})" in text, page


def test_check_fails_on_a_docs_page_or_anchor_the_code_names_and_the_site_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mod = gen_docs()
    for name in ("README.md", "DESIGN.md"):
        (tmp_path / name).write_text("# x\n")
    (tmp_path / "docs" / "guides").mkdir(parents=True)
    (tmp_path / "docs" / "guides" / "alerts.md").write_text(
        "# Alerts\n\n## GPUNodeFailing\n\n## Roll out: a → b\n"
    )
    code = tmp_path / "agent" / "x.py"
    code.parent.mkdir()
    code.write_text('"""docs/guides/alerts.md#gpunodefailing, docs/guides/alerts.md#roll-out-a-b"""\n')
    monkeypatch.setattr(mod, "ROOT", tmp_path)
    assert mod.missing_anchors() == []
    code.write_text('"""docs/guides/alerts.md#gpunodefailin and docs/guides/nope.md"""\n')
    assert mod.missing_anchors() == [
        "agent/x.py: docs/guides/alerts.md#gpunodefailin: no such heading",
        "agent/x.py: docs/guides/nope.md: no such page",
    ]
