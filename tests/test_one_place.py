"""One place for each fact, in the code too: the API request timeout is declared once (beside the
transport, reporters/kube_rest.py), and no module's __all__ re-exports a name it only imports (a split
that leaves its old door open keeps a false edge in the import graph and two ways to spell an import).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_HOME = ROOT / "agent" / "reporters" / "kube_rest.py"
SCANNED = ("agent", "bench", "hostengine", "tests")
# Names pytest finds only in the module's namespace (a fixture a test file shares, a plugin's hook):
# imported on purpose, and __all__ says so.
FOR_PYTEST = {
    "tests/kubeenv/fixtures.py": ["pytest_testnodedown"],
    "tests/test_hung_gpu_kube.py": ["cluster"],
}


def _timeout_literals(source: str) -> list[int]:
    """Lines holding a (5, 30) tuple: a comment naming it is no declaration."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Tuple)
        and [getattr(e, "value", None) for e in node.elts] == [5, 30]
        and all(isinstance(e, ast.Constant) for e in node.elts)
    ]


def test_the_request_timeout_is_declared_once() -> None:
    found = {
        str(path.relative_to(ROOT)): lines
        for path in sorted((ROOT / "agent").rglob("*.py"))
        if (lines := _timeout_literals(path.read_text()))
    }
    home = str(TIMEOUT_HOME.relative_to(ROOT))
    assert list(found) == [home], "import REQUEST_TIMEOUT from agent.reporters.kube_rest"
    assert len(found[home]) == 1


def test_a_second_timeout_literal_is_found() -> None:
    assert _timeout_literals("TIMEOUT = (5, 30)  # copied\nOTHER = (5, 60)\n") == [1]
    assert _timeout_literals("X = 1  # not kube_rest's (5, 30)\n") == []


def _defined(tree: ast.Module) -> set[str]:
    """Names bound at module level by def, class or assignment (under if/try too), not by import."""
    names: set[str] = set()
    for stmt in tree.body:
        for node in ast.walk(stmt) if isinstance(stmt, (ast.If, ast.Try)) else (stmt,):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def _exported(tree: ast.Module) -> list[str]:
    for stmt in tree.body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            assert isinstance(stmt.value, (ast.List, ast.Tuple)), "__all__ is a literal list"
            return [str(e.value) for e in stmt.value.elts if isinstance(e, ast.Constant)]
    return []


def reexports(source: str) -> list[str]:
    """Names in __all__ that the module does not define (it only imports them)."""
    tree = ast.parse(source)
    return [name for name in _exported(tree) if name not in _defined(tree)]


def test_no_module_reexports_what_it_imports() -> None:
    found = {
        str(path.relative_to(ROOT)): names
        for folder in SCANNED
        for path in sorted((ROOT / folder).rglob("*.py"))
        if (names := reexports(path.read_text()))
    }
    assert found == FOR_PYTEST, "import these from the module that defines them, and drop them from __all__"


def test_a_reexport_is_found() -> None:
    source = "from agent.x import moved\nKEPT = 1\n\ndef own() -> None: ...\n\n"
    source += "__all__ = ['KEPT', 'moved', 'own']\n"
    assert reexports(source) == ["moved"]
