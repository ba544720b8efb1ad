"""`spade rollout`: the agent plays each env K times, with or without the hint."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated

import typer

from spade_cli.options import (TOP_K, TOP_P, Address, ApiKey, BackendName, BaseUrl, Compress,
                               ContextLength, Device, EnableThinking, ExecutorName, Inputs,
                               Model, Out, Overwrite, PolicyName, PromptsDir, Round,
                               SamplingSeed, SamplingSeedMode, Seed, Temperature, TopK, TopP,
                               backend_spec)


def register(app: typer.Typer) -> None:
    app.command("rollout")(rollout)


def rollout(
    inputs: Inputs = ["-"],
    out: Out = "-",
    hint: Annotated[bool, typer.Option("--hint/--no-hint",
                                       help="Append the env's hint to the first observation.")] = False,
    plays: Annotated[int, typer.Option("--plays", "-n", min=1, help="Plays per env.")] = 8,
    envs_per_round: Annotated[int | None, typer.Option(
        min=1, help="Play only this many of the input envs, a different slice each round "
                    "(seeded; every env once before any twice): a static pool, as in the "
                    "fixed-env baseline. Default: all.")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Plays at once (one jail each, and "
                                                         "up to this many model requests in "
                                                         "flight).")] = 8,
    barrier: Annotated[bool, typer.Option(
        "--barrier", help="Batch model calls turn by turn, each turn waiting for its longest "
                          "completion, even where the backend streams (vllm, openai). For "
                          "comparison: the records are the same, only slower.")] = False,
    max_turns: Annotated[int, typer.Option(min=1, max=25, help="Turn cap (the env's own "
                                                                "max_turns applies under it).")] = 25,
    turn_timeout: Annotated[float, typer.Option(help="Seconds one env step may take.")] = 10.0,
    episode_timeout: Annotated[float, typer.Option(help="Wall-clock seconds per play, "
                                                        "generation included.")] = 600.0,
    env_budget: Annotated[float, typer.Option(
        min=0.001, help="Seconds of env time per play (load, reset and every step together); "
                        "past it the play ends with outcome env_budget, as do an env's plays "
                        "once they use more than a quarter of their budgets on average.")] = 10.0,
    blacklist_after: Annotated[int, typer.Option(
        min=1, help="Plays that ran out the clock (timeout, env_budget) before an env is not "
                    "played again: its remaining plays are recorded as blacklisted.")] = 1,
    blacklist_from: Annotated[list[str], typer.Option(
        help="Rollout shards of earlier rounds of these envs (repeatable): envs that ran out "
             "the clock there, or whose winning plays were judged a shortcut, are not played "
             "again.")] = [],
    judge: Annotated[bool, typer.Option(
        "--judge/--no-judge",
        help="After the plays, replay each env's winning plays on other seeds of the env, in "
             "the jail and at the play's pace: a no-hint winner whose actions win elsewhere "
             "beyond chance is a shortcut, a hinted one a leaking hint (judgement records "
             "beside the rollouts).")] = True,
    judge_winners: Annotated[int, typer.Option(min=1, help="Winning plays replayed per env "
                                                           "(--judge).")] = 2,
    judge_seeds: Annotated[int, typer.Option(min=1, help="Other seeds each winner is "
                                                         "replayed on (--judge).")] = 3,
    max_observation_chars: Annotated[int, typer.Option(
        min=1, help="Cut each observation and tool result to this many characters (the cut "
                    "is marked).")] = 8192,
    round: Round = 0,
    backend: BackendName = "hf",
    model: Model = ...,
    policy: PolicyName = None,
    temperature: Temperature = 0.6,
    top_p: TopP = TOP_P,
    top_k: TopK = TOP_K,
    enable_thinking: EnableThinking = None,
    max_tokens: Annotated[int, typer.Option(
        help="Most tokens one completion may have. A completion cut here ends its play, as in "
             "the reference (outcome ok, reward 0 unless that step won): the record says "
             "meta.cut_at_max_tokens, and the summary line counts such plays.")] = 512,
    context_length: ContextLength = None,
    seed: Seed = 0,
    sampling_seed: SamplingSeed = SamplingSeedMode.request,
    prompts: PromptsDir = None,
    sandbox: Annotated[str, typer.Option(help="nsjail, or none (NOT a security boundary).")] = "nsjail",
    executor: ExecutorName = "local",
    address: Address = None,
    base_url: BaseUrl = None,
    api_key: ApiKey = None,
    device: Device = None,
    overwrite: Overwrite = False,
    compress: Compress = "jsonl",
) -> None:
    """Play env records and write one rollout record per play (per-turn ids and logprobs).

    Each play runs in its own jail. With vllm and openai each play takes its next turn as soon
    as its own completion returns (the engine batches continuously); hf batches turn by turn.
    A play's sampling seeds come from (play, turn), so the schedule never changes its samples.
    With `--executor ray` each play's jail runs on a node of the Ray cluster (its env steps
    too); the model runs here, or behind --base-url.

    Examples:

        spade rollout runs/q/r00/hint --hint -n 8 -m runs/q/model -o runs/q/r00/rollout-hint
        spade rollout stages/seed_library/envs.jsonl -n 2 -m runs/q/model | jq .reward
        spade rollout envs/ -n 8 -m runs/q/model --executor ray --address head:6379 -o plays/
    """
    from spade_cli.errors import UsageError, errors_to_exit
    from spade_cli.inputs import find_inputs
    from spade_cli.options import StageBackend, open_jail_executor
    from spade_cli.progress import Progress
    from spade_cli.summary import summarize
    from sandbox.jail import Limits, Sandbox
    from sandbox.pool import WorkerPool
    from stages import rollout as stage
    from stages.backends import Sampling
    from stages.shards import Stats, read, run_stage

    with errors_to_exit("rollout"):
        if sandbox not in ("nsjail", "none"):
            raise UsageError(f"--sandbox must be nsjail or none, not {sandbox!r}")
        spec = backend_spec(backend, model, base_url, api_key, device, context_length, policy)
        cfg = stage.Config(plays=plays, hint=hint, concurrency=concurrency, barrier=barrier,
                           max_turns=max_turns,
                           round=round, seed=seed, episode_timeout=episode_timeout,
                           env_budget=env_budget, blacklist_after=blacklist_after,
                           max_observation_chars=max_observation_chars,
                           prompts_dir=prompts,
                           sandbox=Sandbox(mode=sandbox, limits=Limits(call_timeout=turn_timeout)),
                           sampling=Sampling(temperature=temperature, top_p=top_p, top_k=top_k,
                                             max_tokens=max_tokens,
                                             enable_thinking=enable_thinking,
                                             per_request_seed=sampling_seed.per_request))
        shards = find_inputs("rollout", inputs, {"env"}, "env records")
        chosen = None
        if envs_per_round:
            if any(s.path == "-" for s in shards):
                raise UsageError("--envs-per-round reads its inputs twice: give files, not '-'")
            chosen = stage.envs_for_round(
                (r.id for r in read([s.path for s in shards], kinds={"env"})), envs_per_round,
                round, seed)
        blacklist = stage.Blacklist(blacklist_after, read(
            [s.path for s in find_inputs("rollout", blacklist_from, {"rollout", "judgement"},
                                         "rollout records")],
            kinds={"rollout", "judgement"}) if blacklist_from else ())
        if executor == "local" and sandbox == "nsjail":
            from sandbox.pool import fit_concurrency
            from spade_cli.summary import log_line

            fitted, warning = fit_concurrency(concurrency, cfg.sandbox.limits.memory_mb)
            if warning:
                log_line(f"spade rollout: warning: {warning}", echo=True)
                cfg = replace(cfg, concurrency=fitted)  # not in the config digest: resumes
        jails = open_jail_executor(executor, address, cfg.concurrency)
        stats = Stats()
        progress = Progress("rollout", "plays")
        model_backend = StageBackend(spec, progress)

        def transform(envs):
            envs = [env for env in envs if chosen is None or env.id in chosen]
            played = stage.hinted_only(envs, cfg)
            stats.extra["without_hint"] = stats.extra.get("without_hint", 0) + len(envs) - len(played)
            envs = played
            progress.add_total(len(envs) * plays)
            # jails start on background threads while the model loads
            made = []
            with WorkerPool(cfg.sandbox, cfg.concurrency, len(envs) * plays, jails) as pool:
                for record in play(envs, model_backend.get(), pool):
                    made.append(record)
                    yield record
            if judge:
                yield from judged(envs, made)

        def judged(envs, made):
            from stages import judge as judging

            judgements = judging.judge(envs, made, judging.Config(
                winners=judge_winners, seeds=judge_seeds, env_budget=env_budget,
                sandbox=cfg.sandbox))
            for record in judgements:
                if record.verdict != "fair":
                    stats.reasons[record.verdict] += 1
            stats.extra["jail_seconds_judging"] = judging.jail_seconds(
                judgements, stats.extra.get("jail_seconds_judging", 0.0))
            stats.extra["judged"] = stats.extra.get("judged", 0) + len(judgements)
            yield from judgements

        def play(envs, backend, pool):
            for record in stage.run(envs, backend, cfg, pool, blacklist):
                if record.outcome != "ok":
                    stats.reasons[record.outcome] += 1
                stats.extra["wins"] = stats.extra.get("wins", 0) + (record.reward > 0)
                stats.extra["turns"] = stats.extra.get("turns", 0) + len(record.turns)
                if record.meta.get("cut_at_max_tokens"):
                    stats.extra["cut_at_max_tokens"] = stats.extra.get("cut_at_max_tokens", 0) + 1
                progress.advance()
                yield record

        config = {k: v for k, v in locals().items()
                  if k in ("hint", "plays", "max_turns", "turn_timeout", "episode_timeout",
                           "env_budget", "blacklist_after",
                           "max_observation_chars",
                           "round", "backend", "model", "temperature", "top_p", "top_k",
                           "enable_thinking", "max_tokens", "seed", "prompts", "sandbox",
                           "concurrency", "envs_per_round", "judge", "judge_winners",
                           "judge_seeds")} | sampling_seed.config()
        with jails, progress, model_backend:
            run_stage("rollout", shards, out, transform, config, stats, kinds={"env"},
                      overwrite=overwrite, suffix=f".{compress}")
        plays_done = stats.written["rollout"]
        win = stats.extra.get("wins", 0) / plays_done if plays_done else 0.0
        unhinted = stats.extra.get("without_hint", 0)
        summarize("rollout", stats, f"{stats.read} envs -> {plays_done} plays "
                  f"({'hint' if hint else 'no hint'}), win rate {win:.2f}, "
                  f"{stats.extra.get('turns', 0)} turns"
                  + (f", {unhinted} envs without a hint not played" if unhinted else "")
                  + (f", {judged_envs} envs' winners replayed on other seeds "
                     f"({stats.extra['jail_seconds_judging']:.1f} jail-s)"
                     if (judged_envs := stats.extra.get("judged", 0)) else "")
                  + (f", {cut} plays ended at --max-tokens" if (cut := stats.extra.get(
                      "cut_at_max_tokens", 0)) else ""))
