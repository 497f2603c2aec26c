"""The package's structure as its imports draw it: no circle (between modules, those imported
for type checkers included, nor between the package's folders), and the network never imports
what is built on it (sessions, windowed inference, the fast path, the reference's protocol,
the tool). Only the sessions' own modules use their private members."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "mapstream"

# The network and what it stands on; each may import only from this set (and outside packages).
NETWORK = {
    "mapstream.models", "mapstream.heads", "mapstream.layers", "mapstream.attention", "mapstream.cache",
    "mapstream.geometry", "mapstream.config", "mapstream.validation", "mapstream._version",
}
# Built on the network, below the reference's protocol (`mapstream.compat`) and the tool.
ENGINE = NETWORK | {
    "mapstream.session", "mapstream.multistream", "mapstream.fast", "mapstream.windowed", "mapstream.keyframes",
    "mapstream.progress", "mapstream.sequences",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(path: Path, *, typing: bool = False) -> set[str]:
    """The mapstream modules `path` imports when it runs (at any depth, in functions too), and
    with `typing` those imported for type checkers only (`if TYPE_CHECKING:`) too."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    skipped = set()
    for node in ast.walk(tree):
        if not typing and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for n in ast.walk(node))
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {t for t in found if t.startswith("mapstream")}


def _graph(*, typing: bool = False) -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {
        name: {t for t in _runtime_imports(path, typing=typing) if t in modules and t != name}
        for name, path in modules.items()
    }


def _folder(module: str) -> str:
    """The package folder (or top-level module) `module` belongs to: mapstream.X."""
    return ".".join(module.split(".")[:2])


def _folder_graph() -> dict[str, set[str]]:
    """Which of the package's folders (and top-level modules) import which others."""
    folders: dict[str, set[str]] = {}
    for module, targets in _graph(typing=True).items():
        edges = folders.setdefault(_folder(module), set())
        edges.update(_folder(t) for t in targets if _folder(t) not in (_folder(module), "mapstream"))
    return folders


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
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
                circles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return circles


def _floor(module: str, floor: set[str]) -> bool:
    return any(module == top or module.startswith(top + ".") for top in floor)


def test_no_module_imports_itself_through_others():
    """Module by module, with the imports for type checkers: a type one module names from
    another is a dependency all the same."""
    assert _circles(_graph(typing=True)) == []


def test_no_folder_imports_itself_through_others():
    assert _circles(_folder_graph()) == []


def test_the_circle_finder_finds_circles():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("floor", [NETWORK, ENGINE], ids=["network", "engine"])
def test_nothing_imports_upward_from_its_floor(floor):
    graph = _graph()
    upward = {
        module: sorted(t for t in targets if not _floor(t, floor) and t != "mapstream")
        for module, targets in graph.items() if _floor(module, floor)
    }
    assert {m: t for m, t in upward.items() if t} == {}


def _private_members(path: Path, classes: tuple[str, ...]) -> set[str]:
    """The private methods and attributes (`self._x`) of `classes` in the module at `path`."""
    private = set()
    for cls in (n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name in classes):
        for node in ast.walk(cls):
            if isinstance(node, ast.FunctionDef):
                private.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                private.add(node.attr)
    return {name for name in private if name.startswith("_") and not name.startswith("__")}


def test_only_the_sessions_use_their_private_members():
    """Other modules (the multi-stream step among them) drive a `Session` or a `WindowedSession`
    through its public API: no `x._member` of theirs, no private name imported from them."""
    owners = {PACKAGE / "session.py", *(PACKAGE / "windowed").glob("*.py")}
    private = _private_members(PACKAGE / "session.py", ("Session",))
    private |= _private_members(PACKAGE / "windowed" / "online.py", ("WindowedSession",))
    assert {"_scale", "_check_frame", "_session"} <= private  # what the scan looks for
    found = []
    for path in sorted(set(PACKAGE.rglob("*.py")) - owners):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in private and not (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            ):
                found.append(f"{_module_name(path)}:{node.lineno} {ast.unparse(node)}")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").endswith(("session", "windowed")):
                found += [f"{_module_name(path)}:{node.lineno} imports {a.name}" for a in node.names
                          if a.name.startswith("_")]
    assert found == []
