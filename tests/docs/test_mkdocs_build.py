"""`make docs` keeps working: the site, API reference included, builds with --strict (no warnings)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_the_documentation_site_builds_without_warnings(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).parent / "mkdocs"
    if not mkdocs.exists():
        mkdocs = shutil.which("mkdocs")  # type: ignore[assignment]
    if mkdocs is None:
        pytest.skip("mkdocs is not installed: pip install -r requirements-dev.txt")
    done = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    reference = (tmp_path / "site" / "reference" / "trainer" / "index.html").read_text(encoding="utf-8")
    assert "train_step" in reference  # the API reference was generated from the docstrings
