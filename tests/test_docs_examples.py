"""Every shell example of the README and docs/ runs: each ```bash, ```sh and ```console block,
command by command, in a scratch folder that holds the repository's files and a real run of the
quickstart recipe (one round, built once per session; the examples' `runs/quickstart/r03`, the
full recipe's last round, reads that run's last round). A command must exit 0 and, unless it
sends its output to a file, print something; a jq command must print on stdout, and JSON unless
it asks for raw text.

A block that cannot run here (a GPU, the network, a real model, a long run, a rented box) says
so on the line before it, with the reason: `<!-- not run: needs a GPU -->`. There is no other
way out: an unmarked block is run, so a new example is either runnable or marked.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^([ \t]*)```(\w*)[^\n]*\n(.*?)^\1```\s*$", re.S | re.M)  # list items indent
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(.*?)\s*-->$")
SHELL = {"bash", "sh", "console"}
FULL_RECIPE_LAST_ROUND = "runs/quickstart/r03/"
ROUNDS = 1  # of the session's quickstart run
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    text: str
    not_run: str | None  # the marker's reason

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def shell_blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        indent, lang, body = match.groups()
        if lang not in SHELL:
            continue
        before = [line for line in text[:match.start()].splitlines() if line.strip()]
        marker = NOT_RUN.match(before[-1].strip()) if before else None
        found.append(Block(page, text.count("\n", 0, match.start()) + 1, lang,
                           textwrap.dedent(body) if indent else body,
                           marker.group(1) if marker else None))
    return found


BLOCKS = [block for page in PAGES for block in shell_blocks(page)]


def commands(block: Block) -> list[str]:
    """The block's commands: continuation lines joined, comments and blank lines left out;
    in a console block only the `$ ` lines (and their `> ` continuations)."""
    lines = block.text.splitlines()
    if block.lang == "console":
        lines = [line[2:] for line in lines if line.startswith(("$ ", "> "))]
    out, pending = [], ""
    for line in lines:
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        if pending.strip() and not pending.lstrip().startswith("#"):
            out.append(pending.strip())
        pending = ""
    return out


def tokens(command: str) -> list[str]:
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.commenters = "#"
    lexer.whitespace_split = True
    return list(lexer)


def redirected(words: list[str]) -> bool:
    """Whether the command sends some output to a file (`> f`, `2> f`, `>> f`)."""
    return any(word.startswith(">") for word in words if set(word) <= set(">&|"))


def last_jq(words: list[str]) -> list[str] | None:
    """The words of the command's last pipeline stage when it is jq printing to stdout."""
    if redirected(words):
        return None
    stage = words[max((i for i, w in enumerate(words) if w == "|"), default=-1) + 1:]
    return stage if stage and stage[0] == "jq" else None


@pytest.fixture(scope="session")
def quickstart_run(tmp_path_factory, nsjail_ok) -> Path:
    """A real quickstart run, shortened to ROUNDS rounds: its runs/ folder."""
    pytest.importorskip("torch")
    home = tmp_path_factory.mktemp("docs-run")
    (home / "recipes").symlink_to(REPO / "recipes")
    done = subprocess.run([sys.executable, "-m", "spade_cli", "run", "recipes/quickstart.toml",
                           "--rounds", str(ROUNDS)], cwd=home, capture_output=True, text=True,
                          env={**os.environ, **OFFLINE, "PYTHONPATH": str(REPO)}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return home / "runs"


@pytest.fixture(scope="session")
def shell_env(tmp_path_factory) -> dict[str, str]:
    """`spade` on PATH as this checkout's code (not whichever spade is installed)."""
    bin_dir = tmp_path_factory.mktemp("bin")
    spade = bin_dir / "spade"
    spade.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m spade_cli "$@"\n')
    spade.chmod(0o755)
    return {**os.environ, **OFFLINE, "PYTHONPATH": str(REPO),
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


def scratch_folder(tmp_path: Path, runs: Path) -> Path:
    """The repository's files (linked, never written) and the run, as an example sees them."""
    for entry in REPO.iterdir():
        if not entry.name.startswith(".") and entry.name != "runs":
            (tmp_path / entry.name).symlink_to(entry)
    (tmp_path / "runs").symlink_to(runs)
    return tmp_path


def test_every_block_is_run_or_says_why_not():
    assert BLOCKS, "no shell examples found"
    for block in BLOCKS:
        assert block.not_run is None or block.not_run.strip(), \
            f"{block.where}: a not-run marker must name its reason"


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("block", [b for b in BLOCKS if b.not_run is None],
                         ids=lambda b: b.where)
def test_the_example_runs(block, quickstart_run, shell_env, tmp_path):
    folder = scratch_folder(tmp_path, quickstart_run)
    last_round = f"runs/quickstart/r{ROUNDS - 1:02d}/"
    for command in commands(block):
        command = command.replace(FULL_RECIPE_LAST_ROUND, last_round)
        done = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=folder,
                              env=shell_env, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=300)
        said = (f"{block.where}: {command}\nstdout: {done.stdout[-1500:]}\n"
                f"stderr: {done.stderr[-1500:]}")
        assert done.returncode == 0, said
        words = tokens(command)
        if not redirected(words):  # an example shows what it prints: something
            assert (done.stdout + done.stderr).strip(), f"printed nothing: {said}"
        jq = last_jq(words)
        if jq is not None:
            assert done.stdout.strip(), f"printed nothing: {said}"
            if not any(flag in ("-r", "--raw-output") for flag in jq):
                parse_json_stream(done.stdout)


def parse_json_stream(text: str) -> None:
    decoder, at = json.JSONDecoder(), 0
    while (at := len(text) - len(text[at:].lstrip())) < len(text):
        _, at = decoder.raw_decode(text, at)
