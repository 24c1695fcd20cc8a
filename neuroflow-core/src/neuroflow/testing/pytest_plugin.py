"""pytest plugin (entry point ``pytest11: neuroflow``): backend and gradient-check fixtures.

Any package's tests get ``nf_backend`` (parametrised over every installed,
runnable backend) and ``nf_gradcheck`` (the float64 finite-difference check).
pytest loads this plugin in every session wherever neuroflow-core is installed,
so what the fixtures need is imported only when a test asks for them.
"""

from __future__ import annotations

from typing import Any

import pytest


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "nf_backend_name" in metafunc.fixturenames:
        from neuroflow.testing.op_case import installed_backends  # lazy: see the module docstring

        metafunc.parametrize("nf_backend_name", installed_backends())


@pytest.fixture
def nf_backend(nf_backend_name: str) -> Any:
    """A Backend instance; tests using it run once per installed backend."""
    from neuroflow.backends.selection import get_backend  # lazy: see the module docstring

    return get_backend(nf_backend_name)


@pytest.fixture
def nf_gradcheck() -> Any:
    """``neuroflow.testing.gradcheck``: float64 finite-difference check of an operator."""
    from neuroflow.testing.gradcheck import gradcheck  # lazy: see the module docstring

    return gradcheck
