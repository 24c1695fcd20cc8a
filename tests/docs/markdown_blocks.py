"""Code blocks of a Markdown page, with the options their info string gives them.

A fence's info string is ``LANGUAGE [OPTION ...]``; mkdocs uses the first word to highlight and ignores
the rest, so the options cost readers nothing. Options the doc tests understand:

- ``file=PATH``: the block is a file of the walk-through; it is written to ``PATH`` in the page's
  working directory (any language) instead of being run.
- ``requires=cuda``: run only where the ``cuda`` backend can run (CuPy and an NVIDIA GPU); elsewhere
  the block is reported as skipped, with the reason. ``requires=mpi``: likewise, where mpi4py, an
  ``mpiexec`` and neuroflow-distributed are installed.
- ``cwd=repo``: a ``console`` block whose commands run in the repository root (contributor commands
  such as ``pytest tests/core/...``) rather than in the page's working directory.
- ``norun``: not run (installers, ``make`` targets that would recurse); reported as skipped, and its
  ``pip install`` lines are still checked against the distributions in this repository.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

#: Languages a block may have: run (python, console, sh), written or parsed (toml, text), or shown (mermaid).
LANGUAGES = frozenset({"python", "console", "sh", "toml", "text", "mermaid"})
OPTIONS = frozenset({"file", "requires", "norun", "cwd"})

_FENCE = re.compile(r"^(?P<fence>```+|~~~+)(?P<info>.*)$")


@dataclass
class Block:
    """One fenced code block: where it starts (1-based line of its first code line), language, options, code."""

    page: Path
    line: int
    language: str
    options: dict[str, str] = field(default_factory=dict)
    code: str = ""

    @property
    def label(self) -> str:
        return f"{self.page.name}:{self.line}"


def parse_blocks(page: Path) -> list[Block]:
    """Every top-level fenced block of ``page``; raises ValueError for an untagged or unknown block."""
    blocks: list[Block] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        fence, words = match["fence"], match["info"].split()
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not lines[i].startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1
        if not words or words[0] not in LANGUAGES:
            raise ValueError(f"{page}:{start}: a code block needs one of the languages {sorted(LANGUAGES)}; "
                             f"got {' '.join(words) or 'none'}")
        options = dict(word.partition("=")[::2] for word in words[1:])
        unknown = set(options) - OPTIONS
        if unknown:
            raise ValueError(f"{page}:{start}: unknown block option(s) {sorted(unknown)}; valid: {sorted(OPTIONS)}")
        blocks.append(Block(page, start + 1, words[0], options, "\n".join(body) + "\n"))
    return blocks


def console_commands(code: str) -> list[tuple[str, list[str]]]:
    """``$ command`` lines (joined over trailing backslashes) with the output lines shown after each."""
    commands: list[tuple[str, list[str]]] = []
    lines = code.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            command = line[2:]
            while command.endswith("\\") and i + 1 < len(lines):
                i += 1
                command = command[:-1] + "\n" + lines[i]
            commands.append((command, []))
        elif commands:
            commands[-1][1].append(line)
        elif line.strip():
            raise ValueError(f"console block starts with output before any '$ ' command: {line!r}")
        i += 1
    return commands


def shown_output_matches(shown: list[str], actual: str) -> str | None:
    """None when every non-empty shown line matches an output line, in order (``...`` matches anything).

    Otherwise the first shown line that matched nothing, so a stale example says which line went stale.
    """
    actual_lines = [line.rstrip() for line in re.split(r"[\r\n]+", actual)]
    position = 0
    for line in (s.rstrip() for s in shown):
        if not line:
            continue
        pattern = re.compile(".*".join(re.escape(part) for part in line.split("...")))
        while position < len(actual_lines) and not pattern.fullmatch(actual_lines[position]):
            position += 1
        if position == len(actual_lines):
            return line
        position += 1
    return None


_PIP_TARGET = re.compile(r"^['\"]?(?:-e\s+)?(?:\./)?(?P<name>neuroflow[\w-]*)/?(?:\[(?P<extras>[\w,-]+)\])?['\"]?$")


def pip_install_problems(code: str, repo: Path) -> list[str]:
    """For each ``pip install`` line, NeuroFlow distributions or extras it names that this repository lacks."""
    import tomllib

    problems = []
    for line in code.splitlines():
        if "pip install" not in line:
            continue
        words = line.split("#", 1)[0].split("pip install", 1)[1].split()
        for word in words:
            match = _PIP_TARGET.match(word)
            if match is None:
                continue
            project = repo / match["name"] / "pyproject.toml"
            if not project.is_file():
                problems.append(f"{word}: no distribution folder {match['name']}/ in this repository")
                continue
            extras = tomllib.loads(project.read_text())["project"].get("optional-dependencies", {})
            for extra in filter(None, (match["extras"] or "").split(",")):
                if extra not in extras:
                    problems.append(f"{word}: {match['name']} has no extra {extra!r} (it has {sorted(extras)})")
    return problems
