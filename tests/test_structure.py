"""Structure targets for ``open1b.node`` (issue 31): no class is a hub. A class with more methods
than :data:`MAX_METHODS` does more than one job; split it rather than raise the limit.

Run as a script (``python tests/test_structure.py``) to print every class's count, largest first.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_METHODS = 25


def method_counts(folder: Path = ROOT / "node") -> dict[str, int]:
    """``module:Class`` -> the functions defined in its body (properties and dunders included)."""
    counts = {}
    for path in sorted(folder.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                name = f"{path.relative_to(ROOT).with_suffix('')}:{node.name}"
                counts[name] = sum(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in node.body)
    return counts


def test_method_counts_see_every_method():
    # the counter itself: a class of three methods (one async, one property) counts three
    tree = "class A:\n    def a(self): ...\n    async def b(self): ...\n    @property\n    def c(self): ...\n"
    node = ast.parse(tree).body[0]
    assert sum(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in node.body) == 3
    assert method_counts()  # and it finds node/'s classes


# The ledger's data flows one way (node/ledger.py): statements tell the judge, the replay proof and
# the planner's view; the judge writes the counting and tells the view; the outbox stores through
# the statements. A component never imports one that tells it, or that it tells.
ONE_WAY = {
    "counting": {"statements", "judge", "planner_view", "replay_proof", "outbox", "ledger"},
    "planner_view": {"statements", "judge", "replay_proof", "outbox", "ledger"},
    "replay_proof": {"statements", "judge", "planner_view", "outbox", "ledger"},
    "judge": {"statements", "planner_view", "replay_proof", "outbox", "ledger"},
    "statements": {"counting", "judge", "planner_view", "replay_proof", "outbox", "ledger"},
    "outbox": {"counting", "judge", "planner_view", "replay_proof", "ledger"},
}


def node_imports(module: str) -> set[str]:
    """The ``open1b.node`` modules ``node/<module>.py`` imports (relative imports, at any level of the file)."""
    tree = ast.parse((ROOT / "node" / f"{module}.py").read_text())
    return {n.module.split(".")[0] for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module}


def test_the_ledgers_components_import_nothing_that_tells_them():
    assert "counting" in node_imports("planner_view")  # the reader sees what it reads
    crossing = {m: node_imports(m) & forbidden for m, forbidden in ONE_WAY.items()}
    assert not any(crossing.values()), crossing


def test_no_class_in_node_is_a_hub():
    over = {name: n for name, n in method_counts().items() if n > MAX_METHODS}
    assert not over, f"classes above {MAX_METHODS} methods: {over}"


if __name__ == "__main__":
    for name, n in sorted(method_counts().items(), key=lambda item: -item[1])[:15]:
        print(f"{n:4d}  {name}")
