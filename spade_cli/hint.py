"""`spade hint`: the designer writes a privileged hint into each env record."""

from __future__ import annotations

import typer

from spade_cli.options import (JUDGE_TOP_K, JUDGE_TOP_P, ApiKey, BackendName, BaseUrl, Compress,
                               ContextLength, Device, EnableThinking, Inputs, MaxTokens, Model,
                               Out, Overwrite, PolicyName, PromptsDir, Seed, Temperature, TopK,
                               TopP, backend_spec)


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
    prompts: PromptsDir = None,
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
    from spade_cli.errors import errors_to_exit
    from spade_cli.inputs import find_inputs
    from spade_cli.options import StageBackend
    from spade_cli.progress import Progress
    from spade_cli.summary import summarize
    from stages import hint as stage
    from stages.backends import Sampling
    from stages.shards import Stats, run_stage

    with errors_to_exit("hint"):
        spec = backend_spec(backend, model, base_url, api_key, device, context_length, policy)
        cfg = stage.Config(prompts_dir=prompts, sampling=Sampling(
            temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens, seed=seed,
            enable_thinking=enable_thinking))
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
                yield env

        config = {"backend": backend, "model": model, "temperature": temperature,
                  "top_p": top_p, "top_k": top_k, "enable_thinking": enable_thinking,
                  "max_tokens": max_tokens, "seed": seed, "prompts": prompts}
        with progress, model_backend:
            run_stage("hint", shards, out, transform, config, stats, kinds={"env"},
                      overwrite=overwrite, suffix=f".{compress}")
        summarize("hint", stats, f"{stats.written['env']} envs hinted")
