"""`spade hint`: the designer writes a privileged hint into each env record."""

from __future__ import annotations

import typer

from spade_cli.options import (ApiKey, BackendName, BaseUrl, Compress, Device, Inputs, MaxTokens,
                               Model, Out, Overwrite, PromptsDir, Seed, Temperature,
                               backend_spec)


def register(app: typer.Typer) -> None:
    app.command("hint")(hint)


def hint(
    inputs: Inputs = ["-"],
    out: Out = "-",
    backend: BackendName = "hf",
    model: Model = "",
    temperature: Temperature = 0.3,
    max_tokens: MaxTokens = 1024,
    seed: Seed = 0,
    prompts: PromptsDir = None,
    base_url: BaseUrl = None,
    api_key: ApiKey = None,
    device: Device = None,
    overwrite: Overwrite = False,
    compress: Compress = "jsonl",
) -> None:
    """Write a strategy hint (never the answer) for each env, from the env's source."""
    from spade_cli.errors import errors_to_exit
    from spade_cli.summary import summarize
    from stages import hint as stage
    from stages.backends import Sampling, load_backend
    from stages.shards import Stats, find_shards, run_stage

    with errors_to_exit("hint"):
        spec = backend_spec(backend, model, base_url, api_key, device)
        cfg = stage.Config(prompts_dir=prompts, sampling=Sampling(
            temperature=temperature, max_tokens=max_tokens, seed=seed))
        shards = find_shards(inputs, {"env"})
        stats = Stats()
        loaded = []

        def transform(envs):
            if not loaded:
                loaded.append(load_backend(spec))
            return stage.run(envs, loaded[0], cfg)

        config = {"backend": backend, "model": model, "temperature": temperature,
                  "max_tokens": max_tokens, "seed": seed, "prompts": prompts}
        run_stage("hint", shards, out, transform, config, stats, kinds={"env"},
                  overwrite=overwrite, suffix=f".{compress}")
        summarize("hint", stats, f"{stats.written['env']} envs hinted")
