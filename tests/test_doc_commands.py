"""The example commands of the docs cannot rot (issue 46): every command line of a ```sh block in
README.md and docs/ (not the generated reference) is held by a test. `gpu-healthcheck` commands parse
with the CLI's real parser, and the ones that judge a bundled snapshot run, in process, to a verdict
(never a usage error); `make` names a target of the Makefile; `helm` names the chart and only keys
its values.yaml has; `kubectl` and `python` name files that exist. The commands a kube test runs as
written (the canary recipe: tests/test_canary_kube.py; the uninstall order and the rollback's
deletes: tests/test_uninstall.py) are checked here only for their files. What no test can run here
(shell words of a recipe, a flag of another tool) is listed in UNCHECKED, by its first word; a
command in running text (`docker build`, in backticks) is none of these."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest
import yaml

from agent.cli.main import main as cli_main
from agent.cli.parser import EXIT_USAGE, build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "reference" not in p.parts)]
# Shell words of a recipe, and a kube-state-metrics flag shown on its own line: nothing of ours to run.
UNCHECKED = {"mkdir", "done", "cp", "diff", "for", "$EDITOR", "--metric-labels-allowlist"}


def commands() -> list[tuple[str, str]]:
    """(page:line-ish, command) for every command line of the docs' sh blocks: continuation lines
    joined, comments dropped; in a block whose lines start with `$ `, only those (the rest is output)."""
    out = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in re.finditer(r"```(?:sh|bash|shell|console)\n(.*?)```", text, re.S):
            body = m.group(1).replace("\\\n", " ")
            lines = body.splitlines()
            prompted = any(line.startswith("$ ") for line in lines)
            for line in lines:
                if prompted:
                    if not line.startswith("$ "):
                        continue
                    line = line[2:]
                line = strip_comment(line).strip()
                if line:
                    where = f"{page.relative_to(ROOT)}:{text[: m.start()].count(chr(10)) + 1}"
                    out.append((where, line))
    return out


def strip_comment(line: str) -> str:
    """The line without a trailing `# comment` (a # inside quotes or a word stays)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] == " "):
            return line[:i]
    return line


def pieces(line: str) -> list[list[str]]:
    """The simple commands of a line (split at |, ;, &&, ||), each as words."""
    words = shlex.split(line.replace("$(", "( "), posix=True)
    out, cur = [], []
    for w in words:
        if w in ("|", ";", "&&", "||"):
            out.append(cur)
            cur = []
        else:
            cur.append(w)
    out.append(cur)
    return [p for p in out if p]


ALL = commands()


def by_tool(tool: str) -> list[tuple[str, list[str]]]:
    return [(where, p) for where, line in ALL for p in pieces(line) if p[0] == tool]


def test_the_docs_have_the_commands_this_test_expects() -> None:
    tools = {p[0].split("=")[0] for _, line in ALL for p in pieces(line)}
    known = {"gpu-healthcheck", "make", "helm", "kubectl", "python", "jq"} | UNCHECKED
    assert tools <= known, tools - known  # a new tool in the docs: say here how it is checked
    assert len(by_tool("gpu-healthcheck")) >= 20 and len(by_tool("kubectl")) >= 20


@pytest.mark.parametrize(("where", "argv"), by_tool("gpu-healthcheck"), ids=lambda x: str(x)[:60])
def test_every_gpu_healthcheck_command_parses(where: str, argv: list[str]) -> None:
    try:
        build_parser().parse_args(argv[1:])
    except SystemExit as exc:
        pytest.fail(f"{where}: {shlex.join(argv)}: exit {exc.code}")


SNAPSHOT_RUNS = [
    (w, a) for w, a in by_tool("gpu-healthcheck") if "--from-snapshot" in a and "examples/" in " ".join(a)
]


@pytest.mark.parametrize(("where", "argv"), SNAPSHOT_RUNS, ids=lambda x: str(x)[:60])
def test_the_commands_on_a_bundled_snapshot_run_to_a_verdict(where: str, argv: list[str]) -> None:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main([(str(ROOT / a) if a.startswith("examples/") else a) for a in argv[1:]])
    assert code in (0, 1, 2), f"{where}: exit {code}: {err.getvalue()[-400:]}"
    assert code != EXIT_USAGE and out.getvalue().strip()


def test_there_is_a_snapshot_run_and_a_rules_run() -> None:
    assert SNAPSHOT_RUNS
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(["rules"]) == 0
    assert "xid" in out.getvalue()


def test_every_make_command_is_a_target() -> None:
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    for where, argv in by_tool("make"):
        assert set(argv[1:]) <= targets, f"{where}: {shlex.join(argv)}"
    assert {"demo", "test", "demo-cluster"} <= {a for _, argv in by_tool("make") for a in argv[1:]}


def test_every_helm_command_names_the_chart_and_its_values() -> None:
    values = yaml.safe_load((ROOT / "charts" / "gpu-healthcheck" / "values.yaml").read_text())
    for where, argv in by_tool("helm"):
        assert argv[1] in ("install", "upgrade", "uninstall", "rollback"), where
        if argv[1] in ("install", "upgrade"):
            assert "charts/gpu-healthcheck" in argv and (ROOT / "charts/gpu-healthcheck/Chart.yaml").is_file()
        for i, word in enumerate(argv):
            if word == "--set":
                key = argv[i + 1].split("=", 1)[0].split(".")[0]
                assert key in values, f"{where}: --set {key}: not in values.yaml"


FILE_FLAGS = ("-f", "-k", "--from-file")
PLACEHOLDER = re.compile(r"^(OLD/|canary/|live/|promote\.json|-$|\"?\$)")


def test_every_kubectl_and_python_command_names_files_that_exist() -> None:
    named = 0
    for where, argv in by_tool("kubectl"):
        for i, word in enumerate(argv[:-1]):
            flag, _, inline = word.partition("=")
            if flag in FILE_FLAGS:
                path = inline or argv[i + 1]
                if not PLACEHOLDER.match(path):
                    assert (ROOT / path).exists(), f"{where}: {shlex.join(argv)}: {path}"
                    named += 1
    for where, argv in by_tool("python"):
        assert (ROOT / argv[1]).is_file(), f"{where}: {argv[1]}"
    assert named >= 8


def inline_commands() -> list[tuple[str, str]]:
    """`gpu-healthcheck …` spans of the docs' running text (code blocks left out)."""
    out = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        out += [(str(page.relative_to(ROOT)), m) for m in re.findall(r"`(gpu-healthcheck [^`]+)`", text)]
    return out


@pytest.mark.parametrize(("where", "span"), inline_commands(), ids=lambda x: str(x)[:60])
def test_every_gpu_healthcheck_command_in_the_text_names_real_flags(where: str, span: str) -> None:
    """A command in running text may leave out what it requires (`gpu-healthcheck clear` names the
    command), and shows optional flags in [brackets]; every flag and value it does show must parse."""
    argv = shlex.split(span.split(" | ")[0].replace("[", "").replace("]", ""))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            build_parser().parse_args(argv[1:])
        except SystemExit:
            said = err.getvalue().strip().splitlines()[-1]
            assert "the following arguments are required" in said, f"{where}: {span}: {said}"
