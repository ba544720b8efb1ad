"""The seed library: hand-written envs that pass validation, for every game and tool-use skill.

In: the `.py` files beside this module (`games/`, `tool_use/`, and the starter tier in
`starter/`), each opening with a `# spade: domain=... skill=...` header. Out: their paths, their
design records, and the shipped env shards `envs.jsonl` and `starter/envs.jsonl` (what `spade
validate --seed 0` makes of them; `just seeds` regenerates both).
Guarantees: the order is stable (domain, then file name), so ids and shards are reproducible.

The starter tier is three one-turn games answered with a, b or c (the reply's first letter picks;
1 for the right option, 0 for another, -1 for none): the quickstart's env pool, because a tiny
random model learns that answer format within a few GRPO updates. They are not part of the
library proper (`files()` leaves them out), so not in the tiny tokenizer's training text either.

The examples tier (`examples/games`, `examples/tool_use`) is one short env per skill, each whole
in under 2,000 characters (the memory's snippet cut): worked examples for a small designer's
prompt, seeded into the memory at round 0 (`spade seeds --examples`, `memory_seed =
"{examples}"`). The library proper's envs are 6-14k characters, so a snippet shows a cut class.
"""

from __future__ import annotations

from pathlib import Path

from stages.records import Design

HERE = Path(__file__).parent
ENV_SHARD = HERE / "envs.jsonl"
STARTER_SHARD = HERE / "starter" / "envs.jsonl"
EXAMPLES_SHARD = HERE / "examples" / "envs.jsonl"
FOLDERS = {"game": "games", "tool_use": "tool_use"}


def files(domain: str | None = None, tier: Path = HERE) -> list[Path]:
    chosen = [FOLDERS[domain]] if domain else list(FOLDERS.values())
    return [path for folder in chosen for path in sorted((tier / folder).glob("*.py"))]


def example_files(domain: str | None = None) -> list[Path]:
    return files(domain, HERE / "examples")


def starter_files() -> list[Path]:
    return sorted((HERE / "starter").glob("*.py"))


def designs(paths: list[Path] | None = None) -> list[Design]:
    from stages.validate import designs_from_files

    records = designs_from_files(paths if paths is not None else files())
    # Paths differ between machines; keep them relative so records are identical everywhere.
    return [d.model_copy(update={"meta": {"source_file": str(Path(d.meta["source_file"])
                                                              .relative_to(HERE))}})
            for d in records]
