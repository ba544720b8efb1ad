"""`spade rollout`: the agent plays each env K times, with or without the hint."""

from __future__ import annotations

from typing import Annotated

import typer

from spade_cli.options import (ApiKey, BackendName, BaseUrl, Compress, Device, Inputs, MaxTokens,
                               Model, Out, Overwrite, PromptsDir, Round, Seed, Temperature, TopK,
                               TopP, backend_spec)


def register(app: typer.Typer) -> None:
    app.command("rollout")(rollout)


def rollout(
    inputs: Inputs = ["-"],
    out: Out = "-",
    hint: Annotated[bool, typer.Option("--hint/--no-hint",
                                       help="Append the env's hint to the first observation.")] = False,
    plays: Annotated[int, typer.Option("--plays", "-n", min=1, help="Plays per env.")] = 8,
    concurrency: Annotated[int, typer.Option(min=1, help="Plays at once (one jail each; model "
                                                         "calls batched across them).")] = 8,
    max_turns: Annotated[int, typer.Option(min=1, max=25, help="Turn cap (the env's own "
                                                                "max_turns applies under it).")] = 25,
    turn_timeout: Annotated[float, typer.Option(help="Seconds one env step may take.")] = 10.0,
    episode_timeout: Annotated[float, typer.Option(help="Wall-clock seconds per play.")] = 600.0,
    round: Round = 0,
    backend: BackendName = "hf",
    model: Model = "",
    temperature: Temperature = 0.6,
    top_p: TopP = 1.0,
    top_k: TopK = 0,
    max_tokens: MaxTokens = 512,
    seed: Seed = 0,
    prompts: PromptsDir = None,
    sandbox: Annotated[str, typer.Option(help="nsjail, or none (NOT a security boundary).")] = "nsjail",
    base_url: BaseUrl = None,
    api_key: ApiKey = None,
    device: Device = None,
    overwrite: Overwrite = False,
    compress: Compress = "jsonl",
) -> None:
    """Play env records and write one rollout record per play (per-turn ids and logprobs)."""
    from spade_cli.errors import UsageError, errors_to_exit
    from spade_cli.summary import summarize
    from sandbox.jail import Limits, Sandbox
    from sandbox.pool import WorkerPool
    from stages import rollout as stage
    from stages.backends import Sampling, load_backend
    from stages.shards import Stats, find_shards, run_stage

    with errors_to_exit("rollout"):
        if sandbox not in ("nsjail", "none"):
            raise UsageError(f"--sandbox must be nsjail or none, not {sandbox!r}")
        spec = backend_spec(backend, model, base_url, api_key, device)
        cfg = stage.Config(plays=plays, hint=hint, concurrency=concurrency, max_turns=max_turns,
                           round=round, seed=seed, episode_timeout=episode_timeout,
                           prompts_dir=prompts,
                           sandbox=Sandbox(mode=sandbox, limits=Limits(call_timeout=turn_timeout)),
                           sampling=Sampling(temperature=temperature, top_p=top_p, top_k=top_k,
                                             max_tokens=max_tokens))
        shards = find_shards(inputs, {"env"})
        stats = Stats()
        loaded = []

        def transform(envs):
            envs = list(envs)
            # jails start on background threads while the model loads
            with WorkerPool(cfg.sandbox, cfg.concurrency, len(envs) * plays) as pool:
                if not loaded:
                    loaded.append(load_backend(spec))
                yield from play(envs, loaded[0], pool)

        def play(envs, backend, pool):
            for record in stage.run(envs, backend, cfg, pool):
                if record.outcome != "ok":
                    stats.reasons[record.outcome] += 1
                stats.extra["wins"] = stats.extra.get("wins", 0) + (record.reward > 0)
                stats.extra["turns"] = stats.extra.get("turns", 0) + len(record.turns)
                yield record

        config = {k: v for k, v in locals().items()
                  if k in ("hint", "plays", "max_turns", "turn_timeout", "episode_timeout",
                           "round", "backend", "model", "temperature", "top_p", "top_k",
                           "max_tokens", "seed", "prompts", "sandbox", "concurrency")}
        run_stage("rollout", shards, out, transform, config, stats, kinds={"env"},
                  overwrite=overwrite, suffix=f".{compress}")
        plays_done = stats.written["rollout"]
        win = stats.extra.get("wins", 0) / plays_done if plays_done else 0.0
        summarize("rollout", stats, f"{stats.read} envs -> {plays_done} plays "
                  f"({'hint' if hint else 'no hint'}), win rate {win:.2f}, "
                  f"{stats.extra.get('turns', 0)} turns")
