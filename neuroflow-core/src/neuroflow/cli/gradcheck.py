"""``neuroflow gradcheck [OP ...]``: every op's backward against float64 finite differences.

An op takes part when its class has a ``gradcheck_example()`` classmethod
(or attribute) returning ``(op, inputs)`` or ``(op, inputs, options)``:
``op`` an instance, ``inputs`` a list of float64 arrays for ``op.forward``,
``options`` keyword arguments for :func:`neuroflow.testing.gradcheck`
(``prepare`` to reseed a stochastic op, tolerances). The core's ops are
checked with the examples in ``CORE_EXAMPLES``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from neuroflow import ops, registry
from neuroflow.cli.exit_codes import EXIT_FAILURE, EXIT_USAGE
from neuroflow.composites import Concat, Residual, Sequential
from neuroflow.config import match_name
from neuroflow.errors import NeuroFlowError, UnknownNameError
from neuroflow.operator import Operator
from neuroflow.ops.dropout import Dropout
from neuroflow.testing.gradcheck import GradcheckError, gradcheck

HELP = "check ops' backward against float64 finite differences (all ops, or the ones named)"

Example = tuple[Operator, list[np.ndarray], dict[str, Any]]


def _inputs(*shapes: tuple[int, ...]) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal(shape) for shape in shapes]


def _dropout() -> Example:
    op = Dropout(p=0.3, seed=0)

    def reseed() -> None:  # the same mask on every forward, so finite differences see one function
        op.rng = np.random.default_rng(op.seed)

    return op, _inputs((4, 5)), {"prepare": reseed}


#: Core op name → a function returning its gradcheck example (``ops.X`` is looked up when the example is built).
CORE_EXAMPLES: dict[str, Callable[[], Example]] = {
    "Linear": lambda: (ops.Linear(5, 3), _inputs((4, 5)), {}),
    "ReLU": lambda: (ops.ReLU(), _inputs((3, 4)), {}),
    "LeakyReLU": lambda: (ops.LeakyReLU(0.1), _inputs((3, 4)), {}),
    "Sigmoid": lambda: (ops.Sigmoid(), _inputs((3, 4)), {}),
    "Tanh": lambda: (ops.Tanh(), _inputs((3, 4)), {}),
    "GELU": lambda: (ops.GELU(), _inputs((3, 4)), {}),
    "Softmax": lambda: (ops.Softmax(), _inputs((3, 5)), {}),
    "Dropout": _dropout,
    "Flatten": lambda: (ops.Flatten(), _inputs((2, 3, 4)), {}),
    "Reshape": lambda: (ops.Reshape(3, 4), _inputs((2, 12)), {}),
    "Add": lambda: (ops.Add(), _inputs((3, 4), (3, 4)), {}),
    "Sequential": lambda: (Sequential(ops.Linear(4, 5), ops.Tanh(), ops.Linear(5, 3)), _inputs((2, 4)), {}),
    "Residual": lambda: (Residual(Sequential(ops.Linear(4, 4), ops.Tanh())), _inputs((2, 4)), {}),
    "Concat": lambda: (Concat(ops.Linear(4, 3), ops.Tanh()), _inputs((2, 4)), {}),
}


def example_for(name: str, cls: Any) -> Callable[[], Example] | None:
    """The example factory for op ``name``: its own ``gradcheck_example``, else the core table's, else None."""
    own = getattr(cls, "gradcheck_example", None)
    if callable(own):
        def from_op() -> Example:
            result = own()
            if not isinstance(result, tuple) or len(result) not in (2, 3):
                raise TypeError(f"{name}.gradcheck_example() must return (op, inputs) or (op, inputs, options)")
            return result[0], list(result[1]), dict(result[2]) if len(result) == 3 else {}

        return from_op
    return CORE_EXAMPLES.get(name)


def check(factory: Callable[[], Example]) -> str | None:
    """None when the example's backward matches finite differences, else why not."""
    try:
        op, inputs, options = factory()
        gradcheck(op, inputs, **options)
    except GradcheckError as exc:
        return str(exc)
    except Exception as exc:  # an op that crashes fails its check; the others still run
        return f"{type(exc).__name__}: {exc}"
    return None


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ops", nargs="*", metavar="OP", help="op names (default: every op that has an example)")


def _selected(requested: list[str]) -> list[str]:
    names = registry.ops.names()
    if not requested:
        return names
    chosen = []
    for name in requested:
        found = match_name(name, names)
        if found is None:
            raise UnknownNameError("op", name, names, registry.KNOWN_PROVIDERS["neuroflow_ops"].get(name))
        chosen.append(found)
    return chosen


def run(args: argparse.Namespace) -> int:
    plan: list[tuple[str, Callable[[], Example] | str]] = []  # an example factory, or why the op is skipped
    for name in _selected(args.ops):
        try:
            factory = example_for(name, registry.ops.get(name))
        except NeuroFlowError as exc:
            if args.ops:
                raise
            plan.append((name, str(exc)))
            continue
        if factory is None:
            if args.ops:
                print(f"neuroflow: error: op {name!r} has no gradcheck example; give its class a "
                      "gradcheck_example() classmethod returning (op, inputs)", file=sys.stderr)
                return EXIT_USAGE
            plan.append((name, "no gradcheck_example()"))
        else:
            plan.append((name, factory))
    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}
    for name, what in plan:
        problem = what if isinstance(what, str) else check(what)
        verdict = "SKIP" if isinstance(what, str) else "FAIL" if problem else "PASS"
        counts[verdict] += 1
        print(f"{verdict}  {name}" + (f": {problem}" if problem else ""), flush=True)
    print(f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped")
    return EXIT_FAILURE if counts["FAIL"] else 0
