"""The structure of the code, checked from its source: one direction for every import, small parts, no reaching in.

Every module under ``neuroflow-*/src`` is parsed (nothing is imported) and its imports resolved to the
project's modules. An import counts wherever it is written, at module level or inside a function, and so
does ``importlib.import_module("...")`` of a constant name; only an import under ``if TYPE_CHECKING:`` is
left out, since it never runs. The rules:

- **No import circle** in any distribution (or across them): a module never reaches itself through
  the modules it imports.
- **A function-level import of a project module is a lazy import and says why.** It fails when it is part
  of a circle (moving an import into a function hides a circle; it does not remove it: move the piece both
  modules need down instead), and otherwise it needs a comment containing ``lazy:`` on the import's lines
  or on a comment line right above, saying why it must wait: ``# lazy: needs the optional onnx package``,
  ``# lazy: keeps import neuroflow light``. Third-party imports inside functions are not checked here.
- **Imports go down the core's layers** (``LAYERS``, bottom to top) or sideways within one, never up;
  the plugin distributions (``neuroflow_*``) sit above the whole core, and **the core never imports a
  plugin distribution** (a plugin reaches the core through entry points).
- **Small parts:** a module of at most ``MAX_MODULE_LINES`` lines, a class under ``MAX_CLASS_LINES``
  lines, no grab-bag module (``utils``, ``helpers``, ``misc``), no ``x.py`` hidden by a package ``x/``.
- **No reaching into another object's privates:** ``x._name`` (also ``getattr(x, "_name")`` and ``from
  module import _name``) where ``x`` is not ``self``, ``cls``, ``super()`` or ``type(self)``. Dunders
  (``__dict__``), mangled names (``__name``), sunder names (``_value_``), the namedtuple API
  (``_replace``) and attributes of third-party modules (``os._exit``) are exempt. What another object
  needs, make public.
"""

from __future__ import annotations

import ast
import io
import textwrap
import tokenize
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = "neuroflow"
MAX_MODULE_LINES = 400  # a module longer than this fails
MAX_CLASS_LINES = 300  # a class this long or longer fails
GRAB_BAG_NAMES = frozenset({"utils", "util", "helpers", "helper", "misc"})
LAZY_MARK = "lazy:"

#: The core's import layers, bottom to top: a name and the modules (with their submodules) in it. A module
#: may import from its own layer and those below, never from one above. The first names of each row are the
#: layers of the architecture; the other modules sit where their imports put them, in the lowest layer above
#: everything they import. ``neuroflow`` itself is at the top: its ``__getattr__`` reaches everything lazily,
#: the Trainer included, so a module below it imports the module it needs, not the package.
#: This is the one declaration of the layers (docs/architecture.md cites it); change it here.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("neuroflow.version", "neuroflow.blas_idle", "neuroflow.errors", "neuroflow.tensor", "neuroflow.random", "neuroflow.debug", "neuroflow.hookspecs",
              "neuroflow.registry", "neuroflow.plugins", "neuroflow.history", "neuroflow.progress",
              "neuroflow.schedulers", "neuroflow.data", "neuroflow.replay")),
    ("backends", ("neuroflow.backends", "neuroflow.allocators")),
    ("buffers", ("neuroflow.buffers",)),
    ("operator", ("neuroflow.operator", "neuroflow.testing")),
    ("ops", ("neuroflow.folding", "neuroflow.composites", "neuroflow.fusion", "neuroflow.layout_pass", "neuroflow.ops", "neuroflow.losses")),
    ("optim", ("neuroflow.optim",)),
    ("memory", ("neuroflow.memory",)),
    ("checkpoint", ("neuroflow.checkpoint", "neuroflow.export")),
    ("lora", ("neuroflow.lora",)),  # adapters register their children for nf.save and refuse quantized weights
    ("trainer", ("neuroflow.trainer",)),
    ("config", ("neuroflow.config",)),
    ("cli", ("neuroflow.cli", "neuroflow.probe", CORE)),
)
PLUGIN_LAYER = len(LAYERS)  # every plugin distribution's modules: above the whole core

#: Underscore names that are another library's public API, not a private attribute.
PUBLIC_UNDERSCORE_NAMES = frozenset({"_asdict", "_replace", "_fields", "_field_defaults", "_make"})


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    tree: ast.Module
    lines: tuple[str, ...]
    comments: Mapping[int, str]  # line → the comment on it

    @classmethod
    def parse(cls, name: str, path: Path, text: str) -> Module:
        comments = {token.start[0]: token.string for token in tokenize.generate_tokens(io.StringIO(text).readline)
                    if token.type == tokenize.COMMENT}
        return cls(name, path, ast.parse(text, str(path)), tuple(text.splitlines()), comments)

    @property
    def where(self) -> str:
        return str(self.path.relative_to(ROOT))

    @property
    def package(self) -> list[str]:
        """The package a relative import starts from."""
        parts = self.name.split(".")
        return parts if self.path.name == "__init__.py" else parts[:-1]


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module: the longest project module the name starts with, or the name itself
    line: int
    end_line: int
    in_function: bool

    def describe(self) -> str:
        return (f"{self.source} → {self.target} ({where(self.source)}:{self.line}"
                f"{', in a function' if self.in_function else ''})")


@cache
def modules() -> dict[str, Module]:
    """Every module of every distribution, by dotted name (a package ``x/`` wins over an ``x.py`` beside it)."""
    found: dict[str, Module] = {}
    for src in sorted(ROOT.glob("neuroflow-*/src")):
        for package in sorted(p for p in src.iterdir() if (p / "__init__.py").is_file()):
            for path in sorted(package.rglob("*.py")):
                rel = path.relative_to(src).with_suffix("")
                name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
                if name not in found or path.name == "__init__.py":
                    found[name] = Module.parse(name, path, path.read_text(encoding="utf-8"))
    return found


def shadowed_files() -> list[Path]:
    """Modules ``x.py`` that a package ``x/`` beside them hides from every import."""
    return sorted(p for src in ROOT.glob("neuroflow-*/src") for p in src.rglob("*.py")
                  if p.name != "__init__.py" and (p.with_suffix("") / "__init__.py").is_file())


def where(name: str) -> str:
    return modules()[name].where if name in modules() else name


@cache
def _packages() -> frozenset[str]:
    return frozenset(name.partition(".")[0] for name in modules())


def first_party(name: str) -> bool:
    """Whether ``name`` is a module of this project (any ``neuroflow_*`` counts, installed here or not)."""
    top = name.partition(".")[0]
    return top == CORE or top.startswith(CORE + "_") or top in _packages()


def _known(name: str) -> str:
    """The longest project module ``name`` starts with (``a.b.C`` → ``a.b``), else ``name``."""
    candidate = name
    while candidate and candidate not in modules():
        candidate = candidate.rpartition(".")[0]
    return candidate or name


# ---------------------------------------------------------------- the import graph
def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk(node: ast.AST, in_function: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    """Every node below ``node`` with whether it runs inside a function; ``if TYPE_CHECKING:`` bodies skipped."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield other, in_function
                yield from _walk(other, in_function)
            continue
        yield child, in_function
        yield from _walk(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda))


def _targets(module: Module, node: ast.AST) -> list[str]:
    """The project modules an import statement (or ``importlib.import_module("...")``) brings in."""
    if isinstance(node, ast.Import):
        return [_known(alias.name) for alias in node.names if first_party(alias.name)]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            package = module.package[: len(module.package) - node.level + 1]
            base = ".".join(package + ([node.module] if node.module else []))
        if not first_party(base):
            return []
        return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules() else _known(base) for alias in node.names]
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        name, func = node.args[0].value, node.func
        called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if called in ("import_module", "__import__") and isinstance(name, str) and first_party(name):
            return [_known(name)]
    return []


def imports_of(module: Module) -> list[Import]:
    """The imports of project modules in ``module`` (``if TYPE_CHECKING:`` ones left out)."""
    found = []
    for node, in_function in _walk(module.tree):
        for target in dict.fromkeys(_targets(module, node)):
            if target != module.name:
                line = getattr(node, "lineno", 0)
                found.append(Import(module.name, target, line, getattr(node, "end_lineno", None) or line, in_function))
    return found


@cache
def imports() -> tuple[Import, ...]:
    return tuple(imp for module in modules().values() for imp in imports_of(module))


@cache
def graph() -> dict[str, dict[str, list[Import]]]:
    edges: dict[str, dict[str, list[Import]]] = defaultdict(lambda: defaultdict(list))
    for imp in imports():
        edges[imp.source][imp.target].append(imp)
    return edges


def strongly_connected(edges: Mapping[str, Mapping[str, object]]) -> list[frozenset[str]]:
    """The sets of two or more nodes that reach each other (Tarjan's algorithm, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def enter(node: str) -> Iterator[str]:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        return iter(sorted(edges.get(node, {})))

    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, enter(start))]
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    work.append((child, enter(child)))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.add(member)
                    if member == node:
                        break
                if len(members) > 1:
                    found.append(frozenset(members))
    return found


@cache
def circles() -> tuple[frozenset[str], ...]:
    return tuple(strongly_connected(graph()))


def shortest_cycle(edges: Mapping[str, Mapping[str, object]], members: frozenset[str]) -> list[str]:
    """A shortest cycle through the first of ``members`` (breadth-first inside them)."""
    start = min(members)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for child in sorted(edges.get(node, {})):
            if child == start:
                return [*paths[node], start]
            if child in members and child not in paths:
                paths[child] = [*paths[node], child]
                queue.append(child)
    return [start]


def layer_of(name: str) -> int | None:
    """The index in ``LAYERS`` of a core module (longest match), ``PLUGIN_LAYER`` for a plugin's, None if unplaced."""
    if name != CORE and not name.startswith(CORE + "."):
        return PLUGIN_LAYER
    best: tuple[int, int] | None = None
    for number, (_, names) in enumerate(LAYERS):
        for entry in names:
            if (name == entry or (entry != CORE and name.startswith(entry + "."))) and (best is None or len(entry) > best[0]):
                best = (len(entry), number)
    return None if best is None else best[1]


def has_lazy_reason(module: Module, imp: Import) -> bool:
    """Whether a comment on the import's lines, or a comment line right above it, holds ``lazy:``."""
    lines = list(range(imp.line, imp.end_line + 1))
    if imp.line > 1 and module.lines[imp.line - 2].lstrip().startswith("#"):
        lines.append(imp.line - 1)
    return any(LAZY_MARK in module.comments.get(line, "").lower() for line in lines)


# ---------------------------------------------------------------- privates
def _private(name: str) -> bool:
    if not name.startswith("_") or name.startswith("__") or name in PUBLIC_UNDERSCORE_NAMES:
        return False  # public, a dunder or a name the class mangles to its own, or a library's public API
    return not (name.endswith("_") and len(name) > 2)  # sunder: _value_, _fields_


def _own(node: ast.expr) -> bool:
    """``self``, ``cls``, ``super()``, ``type(self)``, ``self.__class__``: the object's own class or instance."""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id == "super" or (node.func.id == "type" and len(node.args) == 1 and _own(node.args[0]))
    return isinstance(node, ast.Attribute) and node.attr == "__class__" and _own(node.value)


def private_accesses(module: Module) -> list[tuple[int, str]]:
    """``(line, code)`` of every access to another object's or module's private attribute in ``module``."""
    outside = {alias.asname or alias.name.partition(".")[0] for node in ast.walk(module.tree)
               if isinstance(node, ast.Import) for alias in node.names if not first_party(alias.name)}
    found = []
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and not _own(node.value):
            if not (isinstance(node.value, ast.Name) and node.value.id in outside):
                found.append((node.lineno, ast.unparse(node)))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and _private(node.args[1].value) and not _own(node.args[0])):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and first_party(node.module or ""):
            names = [alias.name for alias in node.names if _private(alias.name)]
            if names:
                found.append((node.lineno, f"from {node.module} import {', '.join(names)}"))
    return found


def _fail(problems: list[str], rule: str) -> None:
    if problems:
        listing = "\n".join(f"  {line}" for line in sorted(problems))
        pytest.fail(f"{len(problems)} {rule}:\n{listing}", pytrace=False)


# ---------------------------------------------------------------- imports
def test_no_import_circle() -> None:
    problems = []
    for members in circles():
        cycle = shortest_cycle(graph(), members)
        steps = [graph()[a][b][0].describe() for a, b in zip(cycle, cycle[1:])]
        rest = sorted(members - set(cycle))
        problems.append(" → ".join(cycle) + (f" (the circle also holds {', '.join(rest)})" if rest else "")
                        + "".join(f"\n      {step}" for step in steps))
    _fail(problems, "import circle(s): move what both sides need into a module below both (a shared constant "
                    "into a small module of its own), or hand the upper piece down as an argument")


def test_function_level_imports_of_project_modules_are_lazy_for_a_reason() -> None:
    in_circle = {name: members for members in circles() for name in members}
    problems = []
    for imp in imports():
        if not imp.in_function:
            continue
        if imp.target in in_circle.get(imp.source, ()):
            problems.append(f"{where(imp.source)}:{imp.line}: imports {imp.target} inside a function to get round "
                            "an import circle; remove the circle (see test_no_import_circle) and import at the top")
        elif not has_lazy_reason(modules()[imp.source], imp):
            problems.append(f"{where(imp.source)}:{imp.line}: imports {imp.target} inside a function without "
                            f"saying why; import it at the top of the module, or keep it and add `# {LAZY_MARK} "
                            "<why>` (an optional dependency, keeping `import neuroflow` light) on that line or the "
                            "line above")
    _fail(problems, "function-level import(s) of project modules")


def test_every_core_module_has_a_layer() -> None:
    problems = [f"{module.where}: {name} is in no layer of LAYERS (tests/integration/test_structure.py); add it "
                "to the lowest layer above everything it imports"
                for name, module in modules().items() if layer_of(name) is None]
    _fail(problems, "core module(s) outside the layer table")


def test_imports_go_down_the_layers() -> None:
    problems = []
    for imp in imports():
        source, target = layer_of(imp.source), layer_of(imp.target)
        if source is None or target is None or target == PLUGIN_LAYER:
            continue  # unplaced modules and imports of plugins fail tests of their own
        if target > source:
            problems.append(f"{where(imp.source)}:{imp.line}: {imp.source} (layer {LAYERS[source][0]!r}) imports "
                            f"{imp.target} (layer {LAYERS[target][0]!r}, above it)"
                            f"{', in a function' if imp.in_function else ''}; move what it needs down, or have the "
                            "upper layer hand it in (an argument, a registry)")
    _fail(problems, f"import(s) up the core's layers ({' → '.join(name for name, _ in LAYERS)}, bottom to top)")


def test_the_core_never_imports_a_plugin_distribution() -> None:
    problems = [f"{where(imp.source)}:{imp.line}: {imp.source} imports {imp.target}"
                f"{' (in a function)' if imp.in_function else ''}; the plugin provides this to the core through an "
                "entry-point group (neuroflow_ops, neuroflow_datasets, ...), the core names no plugin"
                for imp in imports()
                if imp.source.partition(".")[0] == CORE and imp.target.partition(".")[0] != CORE]
    _fail(problems, "import(s) of a plugin distribution from neuroflow-core")


# ---------------------------------------------------------------- sizes and names
def test_modules_are_at_most_400_lines() -> None:
    problems = [f"{module.where}: {len(module.lines)} lines; split it by concept into modules of at most "
                f"{MAX_MODULE_LINES} (keep the public names importable where they were)"
                for module in modules().values() if len(module.lines) > MAX_MODULE_LINES]
    _fail(problems, f"module(s) over {MAX_MODULE_LINES} lines")


def test_classes_are_under_300_lines() -> None:
    problems = []
    for module in modules().values():
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ClassDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                size = (node.end_lineno or node.lineno) - first + 1
                if size >= MAX_CLASS_LINES:
                    problems.append(f"{module.where}:{node.lineno}: class {node.name} is {size} lines; give parts "
                                    "of it to objects it holds (composition), each a class of its own")
    _fail(problems, f"class(es) of {MAX_CLASS_LINES} lines or more")


def test_no_grab_bag_or_hidden_modules() -> None:
    problems = [f"{module.where}: a module named {module.name.rpartition('.')[2]!r} says nothing of what it holds; "
                "move each piece to the module named after its concept"
                for module in modules().values() if module.name.rpartition(".")[2] in GRAB_BAG_NAMES]
    problems += [f"{path.relative_to(ROOT)}: hidden by the package {path.with_suffix('').name}/ beside it, so no "
                 "import reaches it; delete it (or the package)" for path in shadowed_files()]
    _fail(problems, "module(s) with a grab-bag name or hidden by a package")


# ---------------------------------------------------------------- privates
def test_no_access_to_another_objects_private_attributes() -> None:
    problems = [f"{module.where}:{line}: {code}" for module in modules().values()
                for line, code in private_accesses(module)]
    _fail(problems, "access(es) to another object's or module's private attribute: make what the other side needs "
                    "public (a property, a method, a documented name), or move the code to the object that owns it")


# ---------------------------------------------------------------- the checks themselves
def _fake(source: str, name: str = "neuroflow.cli.fake") -> Module:
    return Module.parse(name, ROOT / "neuroflow-core/src/neuroflow/cli/fake.py", textwrap.dedent(source))


def test_the_checks_see_the_whole_core() -> None:
    assert {"neuroflow", "neuroflow.cli.main", "neuroflow.backends.qualification"} <= set(modules())
    assert {"neuroflow_opencl", "neuroflow_ops_vision", "neuroflow_ops_recurrent", "neuroflow_cuda"} <= _packages()
    edge = graph()["neuroflow.cli.main"]["neuroflow.cli.exit_codes"][0]
    assert not edge.in_function and where(edge.source) == "neuroflow-core/src/neuroflow/cli/main.py"


def test_an_import_counts_in_a_function_too_and_not_under_type_checking() -> None:
    module = _fake('''
        from typing import TYPE_CHECKING

        import numpy as np
        from neuroflow.errors import ConfigError
        from . import table

        if TYPE_CHECKING:
            from neuroflow.trainer import Trainer

        def build():
            # lazy: a reason
            from neuroflow.operator import Operator
            from neuroflow import registry, ops
            return importlib.import_module("neuroflow_ops_vision")
    ''')
    found = {imp.target: imp for imp in imports_of(module)}
    assert {name: imp.in_function for name, imp in found.items()} == {
        "neuroflow.errors": False, "neuroflow.cli.table": False, "neuroflow.operator": True,
        "neuroflow.registry": True, "neuroflow.ops": True, "neuroflow_ops_vision": True}
    assert has_lazy_reason(module, found["neuroflow.operator"])
    assert not has_lazy_reason(module, found["neuroflow.registry"])


def test_circles_are_found_through_every_member() -> None:
    edges = {"a": {"b": 1}, "b": {"c": 1, "d": 1}, "c": {"a": 1}, "d": {}, "e": {"e": 1, "d": 1}}
    assert strongly_connected(edges) == [frozenset("abc")]
    assert shortest_cycle(edges, frozenset("abc")) == ["a", "b", "c", "a"]


def test_layers_and_private_accesses_are_told_apart() -> None:
    assert [layer_of(name) for name in ("neuroflow.errors", "neuroflow.backends.auto", "neuroflow", "neuroflow.cli.x",
                                        "neuroflow_opencl.array", "neuroflow.nowhere")] == [0, 1, 11, 11, PLUGIN_LAYER, None]
    module = _fake('''
        import os
        from neuroflow.random import _generator, manual_seed

        class A:
            def f(self, other):
                os._exit(0)
                self._a, cls._b, super()._c, type(self)._d, self.__class__._e, other.__dict__, other.__x
                point._replace(x=1), member._value_
                return other._f, getattr(other, "_g"), getattr(self, "_h")
    ''')
    assert {code for _, code in private_accesses(module)} == {
        "from neuroflow.random import _generator", "other._f", "getattr(other, '_g')"}
