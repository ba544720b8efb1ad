"""The seed library: hand-written envs that pass validation, for every game and tool-use skill.

In: the `.py` files beside this module (`games/`, `tool_use/`), each opening with a
`# spade: domain=... skill=...` header. Out: their paths, their design records, and the shipped
env shard `envs.jsonl` (what `spade validate` makes of them; `just seeds` regenerates it).
Guarantees: the order is stable (domain, then file name), so ids and shards are reproducible.
"""

from __future__ import annotations

from pathlib import Path

from stages.records import Design

HERE = Path(__file__).parent
ENV_SHARD = HERE / "envs.jsonl"


def files(domain: str | None = None) -> list[Path]:
    folders = {"game": "games", "tool_use": "tool_use"}
    chosen = [folders[domain]] if domain else list(folders.values())
    return [path for folder in chosen for path in sorted((HERE / folder).glob("*.py"))]


def designs(paths: list[Path] | None = None) -> list[Design]:
    from stages.validate import designs_from_files

    records = designs_from_files(paths if paths is not None else files())
    # Paths differ between machines; keep them relative so records are identical everywhere.
    return [d.model_copy(update={"meta": {"source_file": str(Path(d.meta["source_file"])
                                                              .relative_to(HERE))}})
            for d in records]
