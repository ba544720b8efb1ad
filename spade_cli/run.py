"""`spade run`: the whole co-training loop from a recipe, round after round, resumable."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated

import typer

log = logging.getLogger("spade.run")


def register(app: typer.Typer) -> None:
    app.command("run")(run)


def run(
    recipe_path: Annotated[str, typer.Argument(metavar="RECIPE", help="A recipe .toml file.")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the equivalent shell "
                                                             "pipeline instead of running.")] = False,
    rounds: Annotated[int | None, typer.Option(min=1, help="Override the recipe's rounds.")] = None,
    from_round: Annotated[int, typer.Option(min=0, help="Start at this round (earlier rounds "
                                                         "must be finished).")] = 0,
) -> None:
    """Run a recipe: design, validate, hint, rollouts, score-regret, train-grpo, eval per round.

    Killing it and running it again resumes: finished rounds and finished shards are skipped.
    A recipe is checked when it is read: an unknown option or a value of the wrong type stops
    the run at once (exit 65), naming the file, the stage and the key.

    Examples:

        spade run recipes/quickstart.toml
        spade run recipes/quickstart.toml --dry-run > pipeline.sh
    """
    from spade_cli import recipe as recipes
    from spade_cli.errors import errors_to_exit

    with errors_to_exit("run"):
        recipe = recipes.load(recipe_path, rounds)
        if dry_run:
            print_pipeline(recipe, from_round)
        else:
            execute(recipe, from_round)


def print_pipeline(recipe, from_round: int) -> None:
    from spade_cli import recipe as recipes

    run_dir = recipe.run_dir
    model, init = recipes.model_init_commands(recipe)
    print("#!/usr/bin/env bash\nset -euo pipefail")
    print(f"# recipe {recipe.name}: {recipe.rounds} rounds, env sets of {recipe.window} rounds")
    for argv in init:
        print(recipes.shell_line(argv))
    if recipe.memory_seed and recipe.memory:
        print(recipes.shell_line(recipes.memory_seed_command(recipe)))
    print(f"MODEL={model}")

    def call(argv, label):
        print(f"# {label}" + (" (runs while rejected slots remain)" if "attempt" in label
                              and not label.split()[2].startswith("1/") else ""))
        print(recipes.shell_line(argv).replace("'$MODEL'", '"$MODEL"'))

    def after_train(out, current):
        print(f'MODEL="$(ls -d {run_dir}/ckpt/step-* | sort | tail -n 1)"')
        return "$MODEL"

    loop = recipes.Loop(recipe, call, after_train, lambda path, kind: True)
    for index in range(from_round, recipe.rounds):
        print(f"\n# ---- round {index} ----")
        loop.round(index, "$MODEL")


def execute(recipe, from_round: int) -> None:
    from spade_cli import commands
    from spade_cli import recipe as recipes
    from spade_cli import summary
    from spade_cli.errors import UsageError
    from spade_cli.progress import Progress
    from stages.records import content_hash

    run_dir = Path(recipe.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    resolved = recipes.resolved(recipe)
    digest = content_hash(resolved | {"resolved_from": None})
    recipes.write_json(run_dir / "recipe.json", resolved)
    summary.open_run_log(run_dir / "run.log")
    group = commands.group()
    progress = Progress(f"run {recipe.name}", "rounds", recipe.rounds, periodic=False)
    current = {"round": from_round}

    def call(argv: list[str], label: str) -> None:
        progress.note(f"run {recipe.name} r{current['round']:02d}: {label}")
        summary.log_line(f"$ {recipes.shell_line(argv)}")
        try:
            group.main(args=argv, prog_name="spade", standalone_mode=False)
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise SystemExit(exc.code) from None

    start_model, init = recipes.model_init_commands(recipe)
    model = start_model
    for index in range(from_round):
        marker = _marker(run_dir, index)
        if marker is None:
            raise UsageError(f"--from-round {from_round}: round {index} is not finished")
        model = marker["model"]
    loop = recipes.Loop(recipe, call, checkpoint_after, produced)
    with progress:
        if init and not (Path(start_model) / "config.json").exists():
            for argv in init:
                call(argv, "build the initial model")
        if recipe.memory_seed and recipe.memory \
                and not (run_dir / "memory" / "seed.jsonl").exists():
            call(recipes.memory_seed_command(recipe), "seed the memory")
        for index in range(from_round, recipe.rounds):
            marker = _marker(run_dir, index)
            current["round"] = index
            progress.reached(index, recipe.rounds)
            if marker and marker.get("recipe") == digest:
                model = marker["model"]
                summary.log_line(f"run {recipe.name}: round {index} already finished")
                continue
            if marker:
                warn_rerun(recipe.name, index, marker.get("resolved"), resolved)
            model = loop.round(index, model)
            recipes.write_json(run_dir / f"r{index:02d}" / "_round.json",
                               {"round": index, "model": model, "recipe": digest,
                                "resolved": resolved})
    summary.log_line(f"run {recipe.name}: {recipe.rounds} rounds done, model {model}",
                     echo=True)


def warn_rerun(name: str, index: int, before: dict | None, now: dict) -> None:
    """A finished round whose recipe changed is run again: say so, and what changed."""
    from spade_cli import recipe as recipes
    from spade_cli import summary

    changes = recipes.changes(before, now) if before else []
    what = "; ".join(changes) if changes else "the recipe changed since it finished"
    summary.log_line(f"run {name}: warning: round {index} was finished with other settings and "
                     f"runs again: {what}", echo=True)


def _marker(run_dir: Path, index: int) -> dict | None:
    path = run_dir / f"r{index:02d}" / "_round.json"
    return json.loads(path.read_text()) if path.exists() else None


def checkpoint_after(train_out: str, current: str) -> str:
    """The checkpoint train-grpo wrote (from its manifest), or the current model if none."""
    manifest = Path(train_out) / "_manifest.json"
    if not manifest.exists():
        return current
    ckpt = json.loads(manifest.read_text()).get("config", {}).get("ckpt")
    return ckpt if ckpt and ckpt != "None" else current


def produced(path: str, kind: str | None) -> bool:
    """Whether a stage output (dir or file) exists with shards (of `kind`, when given)."""
    target = Path(path)
    if target.is_file():
        return True
    if not target.is_dir():
        return False
    pattern = f"{kind}-*.jsonl*" if kind else "*.jsonl*"
    return any(p.stat().st_size > 0 for p in target.glob(pattern))
