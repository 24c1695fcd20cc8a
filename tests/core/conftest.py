"""Fixtures the core's plugin tests share (tests/core/test_cli.py, test_registry.py)."""

from __future__ import annotations

import sys
import textwrap

import pytest


@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    """Write an importable module (a plugin's code) and forget it after the test."""
    names = []

    def write(name, source):
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        names.append(name)
        return name

    monkeypatch.syspath_prepend(str(tmp_path))
    yield write
    for name in names:
        sys.modules.pop(name, None)
