"""`spade hint`: the designer writes a privileged hint into each env record."""

from __future__ import annotations

from typing import Annotated

import typer

from spade_cli.options import (JUDGE_TOP_K, JUDGE_TOP_P, ApiKey, BackendName, BaseUrl, Compress,
                               ContextLength, Device, EnableThinking, Inputs, MaxTokens, Model,
                               Out, Overwrite, PolicyName, PromptsDir, SamplingSeed,
                               SamplingSeedMode, Seed, Temperature, TopK, TopP, backend_spec)


def register(app: typer.Typer) -> None:
    app.command("hint")(hint)


def hint(
    inputs: Inputs = ["-"],
    out: Out = "-",
    backend: BackendName = "hf",
    model: Model = ...,
    policy: PolicyName = None,
    temperature: Temperature = 0.3,
    top_p: TopP = JUDGE_TOP_P,
    top_k: TopK = JUDGE_TOP_K,
    enable_thinking: EnableThinking = None,
    max_tokens: MaxTokens = 1024,
    context_length: ContextLength = None,
    seed: Seed = 0,
    sampling_seed: SamplingSeed = SamplingSeedMode.request,
    prompts: PromptsDir = None,
    attempts: Annotated[int, typer.Option(
        min=1, help="Hints written per env while its hint leaks: wins most validation seeds "
                    "when the actions it names are played in order, with no model.")] = 3,
    sandbox: Annotated[str, typer.Option(help="Where the leak check plays: nsjail, or none "
                                              "(NOT a security boundary).")] = "nsjail",
    turn_timeout: Annotated[float, typer.Option(help="Seconds one env step of the leak check "
                                                     "may take.")] = 10.0,
    env_budget: Annotated[float, typer.Option(
        min=0.001, help="Seconds of env time per env's leak check (load, then every seed's "
                        "reset and steps); an env past it counts as leaking.")] = 10.0,
    base_url: BaseUrl = None,
    api_key: ApiKey = None,
    device: Device = None,
    overwrite: Overwrite = False,
    compress: Compress = "jsonl",
) -> None:
    """Write a strategy hint (never the answer) for each env, from the env's source.

    Reads env records (other kinds pass by); writes them back with `hint` set, ids unchanged.

    Examples:

        spade hint runs/q/r00/validate-a0 -m runs/q/model -o runs/q/r00/hint
        spade validate my_env.py | spade hint -m runs/q/model > hinted.jsonl
    """
    from sandbox.jail import Limits, Sandbox
    from spade_cli.errors import UsageError, errors_to_exit
    from spade_cli.inputs import find_inputs
    from spade_cli.options import StageBackend
    from spade_cli.progress import Progress
    from spade_cli.summary import summarize
    from stages import hint as stage
    from stages import leaks
    from stages.backends import Sampling
    from stages.shards import Stats, run_stage

    with errors_to_exit("hint"):
        if sandbox not in ("nsjail", "none"):
            raise UsageError(f"--sandbox must be nsjail or none, not {sandbox!r}")
        spec = backend_spec(backend, model, base_url, api_key, device, context_length, policy)
        cfg = stage.Config(prompts_dir=prompts, attempts=attempts, env_budget=env_budget,
                           sandbox=Sandbox(mode=sandbox, limits=Limits(call_timeout=turn_timeout)),
                           sampling=Sampling(
            temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens, seed=seed,
            enable_thinking=enable_thinking, per_request_seed=sampling_seed.per_request))
        shards = find_inputs("hint", inputs, {"env"}, "env records")
        stats = Stats()
        progress = Progress("hint", "envs")
        model_backend = StageBackend(spec, progress)

        def transform(envs):
            envs = list(envs)
            progress.add_total(len(envs))
            for env in stage.run(envs, model_backend.get(), cfg):
                progress.advance()
                if "error" in env.meta["hint"]:
                    stats.reasons["internal_error"] += 1
                verdict = env.meta["hint"].get("leak", {})
                if verdict.get("attempts", 1) > 1:
                    stats.extra["rewritten"] = stats.extra.get("rewritten", 0) + 1
                if leaks.leaking(env):
                    stats.extra["leaks"] = stats.extra.get("leaks", 0) + 1
                if leaks.stalled(env):
                    stats.extra["stalled"] = stats.extra.get("stalled", 0) + 1
                yield env

        config = {"backend": backend, "model": model, "temperature": temperature,
                  "top_p": top_p, "top_k": top_k, "enable_thinking": enable_thinking,
                  "max_tokens": max_tokens, "seed": seed, **sampling_seed.config(),
                  "prompts": prompts,
                  "attempts": attempts, "sandbox": sandbox, "turn_timeout": turn_timeout,
                  "env_budget": env_budget}
        with progress, model_backend:
            run_stage("hint", shards, out, transform, config, stats, kinds={"env"},
                      overwrite=overwrite, suffix=f".{compress}")
        summarize("hint", stats, f"{stats.written['env']} envs hinted, "
                  f"{stats.extra.get('rewritten', 0)} hints rewritten for leaking, "
                  f"{stats.extra.get('leaks', 0)} still leak (of which "
                  f"{stats.extra.get('stalled', 0)} stalled the check: unchecked)")
