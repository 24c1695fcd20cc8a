"""A model's topology as JSON, and the model rebuilt from it through the op registry.

Each op becomes ``{"type": name, "config": op.get_config()}``, where ``name``
is the op's entry point in the ``neuroflow_ops`` group and the config holds its
constructor's keyword arguments. An op whose constructor takes child operators
(a composite) also gets ``"children": [...]``; how to list them and pass them
back is its *child codec*, registered with :func:`register_children`. The core's
Sequential, Residual and Concat have theirs below; a plugin registers its own
composites the same way when its module is imported, and a subclass whose
constructor still takes the children (``ChannelConcat(*branches, layout=...)``)
inherits its parent's. Ops that build their children themselves from their
config (``ResNet(depth=18)``) need no codec. Saving checks each op's config
(and children) against its constructor's signature, so a model that could not
be rebuilt is refused when it is saved, not when it is loaded.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata as importlib_metadata
from typing import Any, cast

from neuroflow import registry
from neuroflow.checkpoint.allocation_guard import RebuildBudget, limit_allocations
from neuroflow.checkpoint.errors import CheckpointError, printable
from neuroflow.composites import Concat, Residual, Sequential
from neuroflow.errors import NeuroFlowError
from neuroflow.operator import Operator

MAX_DEPTH = 64
MAX_NODES = 100_000
#: What a file may name as an op type: a registry name as the ops' entry points spell them, so that a type
#: shown in a message cannot carry control characters or terminal escapes.
OP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,199}")
#: A distribution name as PEP 508 spells it; a file naming anything else gets no install command shown.
DISTRIBUTION_NAME = re.compile(r"[A-Z0-9]|[A-Z0-9][A-Z0-9._-]{0,198}[A-Z0-9]", re.IGNORECASE)

Children = Callable[[Operator], Sequence[Operator]]
Build = Callable[[type[Operator], dict[str, Any], list[Operator]], Operator]


def _positional(cls: type[Operator], config: dict[str, Any], children: list[Operator]) -> Operator:
    return cls(*children, **config)


@dataclass(frozen=True)
class ChildCodec:
    """How a composite's child operators are listed for saving and handed back to its constructor."""

    children: Children
    build: Build


_CODECS: dict[type[Operator], ChildCodec] = {}


def register_children(cls: type[Operator], children: Children, build: Build | None = None) -> None:
    """Declare that ``cls``'s constructor takes child operators.

    ``children(op)`` lists them in the order to save; ``build(cls, config,
    children)`` makes the operator again (default: ``cls(*children, **config)``).
    Subclasses inherit the codec while their constructor accepts the
    children the same way (checked against its signature at save time).

    >>> register_children(MyBlock, lambda op: [op.inner])
    """
    _CODECS[cls] = ChildCodec(children, build or _positional)


def child_codec(cls: type[Operator]) -> ChildCodec | None:
    """The codec registered for ``cls`` or its nearest ancestor that has one."""
    for klass in cls.__mro__:
        codec = _CODECS.get(klass)
        if codec is not None:
            return codec
    return None


def _layers(op: Operator) -> Sequence[Operator]:
    return cast(Sequential, op).layers


def _block_and_shortcut(op: Operator) -> Sequence[Operator]:
    residual = cast(Residual, op)
    return [residual.block, residual.shortcut] if residual.has_shortcut else [residual.block]


def _branches(op: Operator) -> Sequence[Operator]:
    return cast(Concat, op).branches


register_children(Sequential, _layers)
register_children(Residual, _block_and_shortcut)
register_children(Concat, _branches)


# --------------------------------------------------------------------------- model → JSON
def describe(model: Operator) -> dict[str, Any]:
    """The JSON-able topology of ``model``: its op tree plus the distribution and version of each op type."""
    ops: dict[str, dict[str, str | None]] = {}
    root = _node(model, ops, "model")
    return {"root": root, "ops": ops}


def _node(op: Operator, ops: dict[str, dict[str, str | None]], where: str) -> dict[str, Any]:
    name = registered_name(op, where)
    if name not in ops:
        if not OP_NAME.fullmatch(name):
            raise CheckpointError(
                f"{where} is registered as {name!r}, which a model file cannot name; register the op under a name "
                "of letters, digits, '_', '.' and '-' that starts with a letter or '_'"
            )
        dist = registry.ops.distribution(name)
        ops[name] = {"distribution": dist, "version": _version(dist)}
    config = op.get_config()
    try:
        json.dumps(config)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{where} ({name}): get_config() returned {config!r}, which is not JSON ({exc})") from None
    node: dict[str, Any] = {"type": name, "config": config}
    children = _constructor_children(op, name, config, where)
    if children is not None:
        node["children"] = [_node(child, ops, f"{where}.{i}") for i, child in enumerate(children)]
    return node


def registered_name(op: Operator, where: str = "model") -> str:
    """The name under which ``type(op)`` is registered in the ``neuroflow_ops`` group."""
    cls = type(op)
    candidates = [cls.__name__] + [n for n in registry.ops.names() if n != cls.__name__]
    for name in candidates:
        if name not in registry.ops:
            continue
        try:
            if registry.ops.get(name) is cls:
                return name
        except NeuroFlowError:
            continue
    raise CheckpointError(
        f"{where} is a {cls.__module__}.{cls.__qualname__}, which is not a registered op, so a model file "
        "could not rebuild it; register it as a 'neuroflow_ops' entry point (or registry.ops.register(name, cls))"
    )


def _version(dist: str | None) -> str | None:
    if dist is None:
        return None
    try:
        return importlib_metadata.version(dist)
    except importlib_metadata.PackageNotFoundError:
        return None


def _constructor_children(op: Operator, name: str, config: dict[str, Any], where: str) -> list[Operator] | None:
    """The child ops to pass to ``op``'s constructor, None when it takes only its config; raises if neither works."""
    cls = type(op)
    codec = child_codec(cls)
    try:
        signature: inspect.Signature | None = inspect.signature(cls)
    except (TypeError, ValueError):  # no introspectable signature: trust the codec or the config
        signature = None
    if codec is not None:
        children = list(codec.children(op))
        if signature is None or _binds(signature, children, config):
            return children
    if signature is None or _binds(signature, [], config):
        takes_positional = any(p.kind is p.VAR_POSITIONAL for p in signature.parameters.values()) if signature else False
        if takes_positional and any(True for _ in op.children()):
            raise CheckpointError(
                f"{where} ({name}) has child ops that its constructor takes positionally; register a child codec "
                "with neuroflow.checkpoint.register_children so a model file can pass them back"
            )
        return None
    missing = [
        p.name for p in signature.parameters.values()
        if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in config
    ]
    problem = f"lacks the constructor argument(s) {', '.join(missing)}" if missing else "does not fit its constructor"
    raise CheckpointError(
        f"{where} ({name}): get_config() {problem}, so the op cannot be rebuilt; return them from get_config(), "
        "or, when they are child operators, register a child codec with neuroflow.checkpoint.register_children"
    )


def _binds(signature: inspect.Signature, children: list[Operator], config: dict[str, Any]) -> bool:
    try:
        signature.bind(*children, **config)
    except TypeError:
        return False
    return True


# --------------------------------------------------------------------------- JSON → model
def validate(topology: Any, source: str) -> dict[str, Any]:
    """Check the structure of a topology read from a file (types, nesting, size); returns it."""
    if not isinstance(topology, dict) or not isinstance(topology.get("root"), dict):
        raise CheckpointError(f"{source}: topology must be an object with a 'root' op")
    ops = topology.get("ops", {})
    if not isinstance(ops, dict) or not all(isinstance(v, dict) for v in ops.values()):
        raise CheckpointError(f"{source}: topology 'ops' must map op names to objects")
    root = topology["root"]
    # Iterative, so a hostile nesting depth cannot exhaust the interpreter's stack; op paths are named only on error.
    stack: list[tuple[dict[str, Any], int]] = [(root, 0)]
    count = 0
    while stack:
        node, depth = stack.pop()
        count += 1
        if depth > MAX_DEPTH or count > MAX_NODES:
            raise CheckpointError(f"{source}: topology is nested deeper than {MAX_DEPTH} or has over {MAX_NODES} ops")
        kind = node.get("type")
        if not isinstance(kind, str) or not isinstance(node.get("config"), dict):
            raise CheckpointError(
                f"{source}: op {_where(root, node)} needs a string 'type' and an object 'config'; got {node!r:.200}"
            )
        if not OP_NAME.fullmatch(kind):
            raise CheckpointError(
                f"{source}: op {_where(root, node)} has type {kind!r:.100}, which is not an op name (a letter or '_', "
                "then letters, digits, '_', '.' or '-'); the file is corrupt or hostile"
            )
        children = node.get("children")
        if children is not None:
            if not (isinstance(children, list) and all(isinstance(c, dict) for c in children)):
                raise CheckpointError(f"{source}: op {_where(root, node)} has 'children' that is not a list of ops")
            stack.extend((child, depth + 1) for child in reversed(children))
    return topology


def _nodes(root: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every op of a validated topology, parents first."""
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(node.get("children") or ()))


def _where(root: dict[str, Any], target: dict[str, Any]) -> str:
    """The dotted path (``model.1.0``) of the op ``target`` under ``root``, for error messages."""
    stack: list[tuple[Any, str]] = [(root, "model")]
    while stack:
        node, where = stack.pop()
        if node is target:
            return where
        children = node.get("children") if isinstance(node, dict) else None
        if isinstance(children, list):
            stack.extend((child, f"{where}.{i}") for i, child in enumerate(children))
    return "?"


def resolve_op_types(topology: dict[str, Any], source: str) -> dict[str, type[Operator]]:
    """Every op type the topology names, imported through the registry; one error lists all that are missing."""
    names = sorted({node["type"] for node in _nodes(topology["root"])})
    recorded = topology.get("ops", {})
    found: dict[str, type[Operator]] = {}
    problems = []
    for name in names:
        if name not in registry.ops:
            problems.append(_not_installed(name, recorded.get(name, {}).get("distribution")))
            continue
        try:
            cls = registry.ops.get(name)
        except NeuroFlowError as exc:
            problems.append(str(exc))
            continue
        if not (isinstance(cls, type) and issubclass(cls, Operator)):
            problems.append(f"registry entry {name!r} is {cls!r}, not an Operator class")
            continue
        found[name] = cls
    if problems:
        raise CheckpointError(f"{source}: cannot rebuild the model: " + "; ".join(problems))
    return found


def _not_installed(name: str, recorded: Any) -> str:
    """What to do about op ``name``, which no installed distribution provides, given the distribution the file names.

    Only a provider NeuroFlow knows (:data:`registry.KNOWN_PROVIDERS`) is advice to install; the file's own
    claim is shown as the file's, and only when it is a distribution name at all.
    """
    known = registry.KNOWN_PROVIDERS["neuroflow_ops"].get(name)
    if known is not None:
        return f"op {name!r} needs the distribution {known}: pip install {known}"
    unknown = f"unknown op {name!r} (no installed distribution provides it)"
    if recorded is None or recorded == "":
        return unknown
    if not isinstance(recorded, str) or not DISTRIBUTION_NAME.fullmatch(recorded):
        return f"{unknown}; the file names an invalid distribution {recorded!r:.100} for it, which cannot be installed"
    return (f"{unknown}; the file says it comes from the distribution {recorded!r}, which NeuroFlow does not know: "
            "make sure it is the one you mean before you install it")


def build(topology: dict[str, Any], source: str, held_values: int) -> Operator:
    """The model the topology describes, with placeholder parameters that the caller replaces.

    Constructors run under one :class:`~neuroflow.checkpoint.allocation_guard.RebuildBudget`
    for a file of ``held_values`` values: every array numpy makes meanwhile and
    every random draw is charged to it before it exists, so a topology asking
    for more than the file could fill is refused, naming the op and the size it
    asked for, before that memory is allocated (see :mod:`neuroflow.checkpoint.allocation_guard`).
    """
    types = {name: (cls, child_codec(cls)) for name, cls in resolve_op_types(topology, source).items()}
    root = topology["root"]
    budget = RebuildBudget(held_values)
    with limit_allocations(budget, source):
        return _Builder(types, topology.get("ops", {}), source, root, budget).build(root)


@dataclass(frozen=True)
class _Builder:
    """Makes the op of each node of a validated topology, children first."""

    types: dict[str, tuple[type[Operator], ChildCodec | None]]
    recorded: dict[str, Any]
    source: str
    root: dict[str, Any]
    budget: RebuildBudget

    def build(self, node: dict[str, Any]) -> Operator:
        name, config = node["type"], node["config"]
        cls, codec = self.types[name]
        saved_children = node.get("children")
        children = None
        if saved_children is not None:
            if codec is None:
                raise CheckpointError(
                    f"{self.source}: op {_where(self.root, node)} ({name}) is saved with child ops but has no child codec"
                )
            children = [self.build(child) for child in saved_children]
        try:
            op = cls(**config) if codec is None or children is None else codec.build(cls, config, children)
        except Exception as exc:  # a hostile config can make a constructor raise anything
            if self.budget.refused is not None:
                raise self._refused(node) from None
            if isinstance(exc, CheckpointError):
                raise
            raise self._failed(node, exc) from None
        if self.budget.refused is not None:  # the constructor caught the MemoryError itself
            raise self._refused(node)
        if type(op) is not cls:
            raise CheckpointError(f"{self.source}: op {_where(self.root, node)}: building {name} gave a {type(op).__name__}")
        return op

    def _refused(self, node: dict[str, Any]) -> CheckpointError:
        return CheckpointError(self.budget.refusal_message(self.source, f"op {_where(self.root, node)} ({node['type']})"))

    def _failed(self, node: dict[str, Any], exc: Exception) -> CheckpointError:
        name, config = node["type"], node["config"]
        saved = self.recorded.get(name, {}).get("version")
        installed = _version(registry.ops.distribution(name))
        versions = f" (saved with version {saved!r}, installed {installed!r})" if saved != installed else ""
        return CheckpointError(
            f"{self.source}: cannot rebuild op {_where(self.root, node)} ({name}) from config {config!r:.300}{versions}: "
            f"{type(exc).__name__}: {printable(str(exc))}"
        )


def named_modules(model: Operator, prefix: str = "") -> Iterator[tuple[str, Operator]]:
    """Every operator in ``model`` under its dotted path (the root is ``""``), parents first."""
    yield prefix, model
    for name, child in model.named_children():
        yield from named_modules(child, f"{prefix}.{name}" if prefix else name)
