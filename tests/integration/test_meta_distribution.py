"""The root meta distribution `neuroflow`: its extras name the distributions of this repository."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _distributions() -> dict[str, dict]:
    found = {}
    for pyproject in ROOT.glob("neuroflow-*/pyproject.toml"):
        project = tomllib.loads(pyproject.read_text())["project"]
        found[project["name"]] = project
    return found


def test_every_extra_names_a_distribution_here_and_its_extra():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dists = _distributions()
    assert meta["name"] == "neuroflow" and meta["dependencies"] == ["neuroflow-core"]
    assert {"vision", "recurrent", "opencl", "cuda", "distributed", "all"} <= set(meta["optional-dependencies"])
    for extra, requirements in meta["optional-dependencies"].items():
        for requirement in requirements:
            name, _, inner = re.fullmatch(r"([a-z0-9-]+)(\[([a-z0-9]+)\])?", requirement).groups()
            assert name in dists, f"extra {extra!r} needs {name}, which is not a distribution of this repository"
            if inner:
                assert inner in dists[name].get("optional-dependencies", {}), f"{name} has no extra {inner!r}"
