"""Our code has no import cycles: each module imports alone, in an interpreter that has loaded
none of ours, and the graph of every import statement — function-level ones included, which hide
cycles from a reader — has no cycle. The product (protocol, deterministic, node) reaches nothing
of the test harness (devnet, sim), which sits on top of it.

``from pkg import name`` counts as an import of ``pkg.name`` when that is a module, else of
``pkg``; imports under ``if TYPE_CHECKING:`` are not executed and are left out.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"protocol": "open1b.protocol", "deterministic": "open1b.deterministic", "node": "open1b.node",
            "devnet": "open1b.devnet", "sim": "open1b.sim"}
HARNESS = ("open1b.devnet", "open1b.sim")


def product_modules() -> dict[str, Path]:
    modules = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if "__pycache__" in parts:
                continue
            name = ".".join((package, *parts))
            modules[name.removesuffix(".__init__")] = path
    return modules


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and _type_checking_only(node, parents):
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        found |= {t for t in targets if t in modules and t != name}
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_of_product_code_has_no_cycle():
    modules = product_modules()
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert cycles(graph) == []


def _is_harness(name: str) -> bool:
    return any(name == h or name.startswith(h + ".") for h in HARNESS)


def closure(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(graph[name])
    return seen


def test_the_daemon_and_the_cli_reach_nothing_of_the_test_harness():
    """devnet/ and sim/ are a harness on top of the node (docs/node.md): nothing the daemon or the
    CLI imports, directly or not, function-level imports included, is part of it, and no product
    module imports it (``open1b-node devnet`` runs the harness's program in a child process)."""
    modules = product_modules()
    assert {m for m in modules if _is_harness(m)} >= {"open1b.devnet", "open1b.devnet.scenarios",
                                                      "open1b.devnet.daemon_entry", "open1b.sim"}
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    for start in ("open1b.node.daemon", "open1b.node.cli"):
        reached = closure(graph, start)
        assert "open1b.node.config" in reached  # (the walk does follow imports)
        assert not {m for m in reached if _is_harness(m)}, start
    importers = {m for m, deps in graph.items() if any(_is_harness(d) for d in deps)}
    assert {m for m in importers if not _is_harness(m)} == set()


def test_the_harness_check_sees_a_function_level_import_of_the_harness(tmp_path):
    source = tmp_path / "cli.py"
    source.write_text("def cmd():\n    from open1b.devnet.cli import main\n")
    modules = {**product_modules(), "open1b.node.cli": source}
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert any(_is_harness(m) for m in closure(graph, "open1b.node.cli"))


def test_the_graph_walk_sees_function_level_imports():
    modules = {"open1b.node.a": Path("a.py"), "open1b.node.b": Path("b.py")}
    graph = {"open1b.node.a": {"open1b.node.b"}, "open1b.node.b": {"open1b.node.a"}}
    assert cycles(graph) == [["open1b.node.a", "open1b.node.b"]]
    source = ROOT / "node" / "cli.py"  # imports most of the node inside its commands
    assert "open1b.node.daemon" in imports_of("open1b.node.cli", source, product_modules())
    assert modules  # (the toy graph above is what cycles() must catch)


# Imported first by the parent, so each child only pays for its own modules: none of ours is among them.
THIRD_PARTY = ["numpy", "numba", "torch", "multiaddr", "trio", "cbor2", "nacl.signing", "libp2p", "safetensors", "prometheus_client", "rich"]


def test_every_product_module_imports_alone_in_a_fresh_interpreter():
    """One interpreter, then a forked child per module: each child starts with none of our modules
    loaded and imports exactly one, as a user's ``import open1b.node.x`` would. The parent first
    loads every other module ours load (THIRD_PARTY, then whatever a child that imports all of
    ours loaded besides them: fastapi, hypercorn, pydantic ... ), so that each child pays for our
    modules alone: the devnet's modules each re-imported the node's web stack, most of the
    test's time."""
    names = sorted(product_modules())
    script = textwrap.dedent(f"""
        import importlib, os, sys, traceback
        for lib in {THIRD_PARTY!r}:
            try:
                importlib.import_module(lib)
            except ImportError:
                pass
        loaded = set(sys.modules)
        reader, writer = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(reader)
            for name in {names!r}:
                try:
                    importlib.import_module(name)
                except BaseException:
                    pass  # (each child below reports it)
            others = [m for m in sys.modules if m not in loaded and not m.startswith("open1b")]
            with os.fdopen(writer, "w") as out:
                out.write("\\n".join(others))
            os._exit(0)
        os.close(writer)
        with os.fdopen(reader) as got:
            others = got.read().split()
        os.waitpid(pid, 0)
        for lib in others:
            try:
                importlib.import_module(lib)
            except BaseException:
                pass
        assert not any(m.startswith("open1b") for m in sys.modules)
        failed = []
        for name in {names!r}:
            pid = os.fork()
            if pid == 0:
                try:
                    importlib.import_module(name)
                except BaseException:
                    traceback.print_exc()
                    os._exit(1)
                os._exit(0)
            _, status = os.waitpid(pid, 0)
            if status:
                failed.append(name)
        print("FAILED", failed)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "FAILED []" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]
