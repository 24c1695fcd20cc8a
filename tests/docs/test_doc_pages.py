"""Every code block of docs/, README.md and CONTRIBUTING.md runs, page by page, so no example goes stale.

A page is a walk-through: its blocks run in order, like a notebook, in one Python namespace and one
working directory (a fresh temporary directory holding a copy of ``examples/*.toml`` and a link to the
checkout's ``.venv``). ``python`` blocks are executed; ``console`` blocks run each ``$ command`` in bash
with ``.venv/bin`` first on PATH, must exit 0, and every output line the page shows must appear in
the real output, in order (``...`` stands for anything); ``sh`` blocks run as one bash script;
``toml`` blocks are parsed (and written with ``file=``). When a block fails, the page's later blocks
are skipped with a reason naming it. Options (``file=``, ``requires=cuda``, ``norun``, ``cwd=repo``) are described
in ``markdown_blocks.py``.

Why not pytest-markdown-docs: it runs each block on its own, and a block continuing an earlier one
re-executes every block before it, so a page that trains a model and then saves, quantizes and
exports it would train four times. Here each block runs once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from markdown_blocks import (  # tests/docs is on sys.path (pytest's rootdir-relative import)
    Block,
    console_commands,
    parse_blocks,
    pip_install_problems,
    shown_output_matches,
)

REPO = Path(__file__).resolve().parents[2]
PAGES = [*sorted((REPO / "docs").rglob("*.md")), REPO / "README.md", REPO / "CONTRIBUTING.md"]
BLOCKS = [block for page in PAGES if page.is_file() for block in parse_blocks(page)]
# A guard against a hung command, not a speed test: `neuroflow doctor` (CONTRIBUTING.md) qualifies both OpenCL
# drivers in the page's empty cache, 118-122 s each, side by side, on an idle 2-core machine (2026-12-06), and
# failed a 240 s limit once under load.
COMMAND_TIMEOUT_S = 600


@dataclass
class PageRun:
    """What the blocks of one page share: a namespace, a working directory, and the first failure."""

    workdir: Path
    namespace: dict[str, Any] = field(default_factory=lambda: {"__name__": "__doc_page__"})
    failed: str | None = None


_runs: dict[Path, PageRun] = {}


def page_run(page: Path, factory: pytest.TempPathFactory) -> PageRun:
    if page not in _runs:
        workdir = factory.mktemp(page.stem)
        (workdir / "examples").mkdir()
        for config in (REPO / "examples").glob("*.toml"):
            shutil.copy(config, workdir / "examples" / config.name)
        (workdir / ".venv").symlink_to(REPO / ".venv")
        _runs[page] = PageRun(workdir)
    return _runs[page]


def cuda_runs_here() -> bool:
    from neuroflow import registry
    from neuroflow.errors import NeuroFlowError

    try:
        return "cuda" in registry.backends and bool(registry.backends.get("cuda").is_available())
    except NeuroFlowError:
        return False


def mpi_runs_here() -> bool:
    import importlib.util

    found = all(importlib.util.find_spec(m) is not None for m in ("mpi4py", "neuroflow_distributed"))
    return found and (Path(sys.executable).with_name("mpiexec").exists() or shutil.which("mpiexec") is not None)


def shell_env(workdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["NEUROFLOW_CACHE_DIR"] = str(workdir / ".cache")  # `auto` measures afresh, in the page's own cache
    env.pop("NEUROFLOW_BACKEND", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_shell(command: str, workdir: Path, cwd: Path | None = None) -> str:
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", command], cwd=cwd or workdir, env=shell_env(workdir),
                          capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    output = done.stdout + done.stderr
    if done.returncode != 0:
        pytest.fail(f"`{command}` exited with {done.returncode}:\n{output[-4000:]}", pytrace=False)
    return output


def run_block(block: Block, run: PageRun) -> None:
    if "file" in block.options:
        target = run.workdir / block.options["file"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.code, encoding="utf-8")
        if block.language == "toml":
            tomllib.loads(block.code)
        return
    if block.language == "python":
        code = compile("\n" * (block.line - 1) + block.code, str(block.page), "exec")
        exec(code, run.namespace)  # noqa: S102 - running the documentation is the point
    elif block.language == "console":
        cwd = REPO if block.options.get("cwd") == "repo" else None
        for command, shown in console_commands(block.code):
            output = run_shell(command, run.workdir, cwd)
            stale = shown_output_matches(shown, output)
            if stale is not None:
                pytest.fail(f"{block.label}: `{command}` printed no line matching\n    {stale}\n"
                            f"(after the lines matched before it); it printed:\n{output[-4000:]}", pytrace=False)
    elif block.language == "sh":
        run_shell(block.code, run.workdir)
    elif block.language == "toml":
        tomllib.loads(block.code)


@pytest.mark.parametrize("block", BLOCKS, ids=[block.label for block in BLOCKS])
def test_doc_block_runs(block: Block, tmp_path_factory: pytest.TempPathFactory,
                        monkeypatch: pytest.MonkeyPatch) -> None:
    if "norun" in block.options:
        problems = pip_install_problems(block.code, REPO)
        assert not problems, f"{block.label}: " + "; ".join(problems)
        pytest.skip(f"{block.label}: marked norun (installs or make targets); its pip install lines were checked")
    if block.options.get("requires") == "cuda" and not cuda_runs_here():
        pytest.skip(f"{block.label}: needs the cuda backend (CuPy and an NVIDIA GPU), not available here")
    if block.options.get("requires") == "mpi" and not mpi_runs_here():
        pytest.skip(f"{block.label}: needs MPI (pip install -e 'neuroflow-distributed[mpich]'), not installed here")
    if block.language in ("text", "mermaid") and "file" not in block.options:
        return  # shown, not run: output samples and diagrams
    run = page_run(block.page, tmp_path_factory)
    if run.failed is not None:
        pytest.skip(f"an earlier block of this page failed: {run.failed}")
    monkeypatch.chdir(run.workdir)
    monkeypatch.syspath_prepend(str(run.workdir))
    try:
        run_block(block, run)
    except BaseException:
        run.failed = block.label
        raise


def test_every_page_has_a_block_that_runs() -> None:
    """A page made only of skipped or shown blocks would test nothing."""
    for page in PAGES:
        blocks = [b for b in BLOCKS if b.page == page]
        runnable = [b for b in blocks if "norun" not in b.options
                    and b.options.get("requires") not in ("cuda", "mpi") and b.language not in ("text", "mermaid")]
        assert runnable or not blocks or page.name.lower() == "contributing.md", \
            f"{page} has no block that the doc tests run"
