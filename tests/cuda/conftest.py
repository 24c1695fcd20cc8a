"""Shared by the cuda tests: a cuda backend fixture.

GPU test modules skip through ``neuroflow_cuda.unavailable_reason()``, which
never raises, so collecting them without CuPy or without a device only skips.
"""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def cuda() -> Any:
    """The cuda:0 backend (only GPU test modules, which skip without one, use it)."""
    from neuroflow.backends.selection import get_backend

    return get_backend("cuda:0")
