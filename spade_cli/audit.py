"""`spade audit`: a model judges whether each validated env can be won (optional stage)."""

from __future__ import annotations

from typing import Annotated

import typer

from spade_cli.options import (JUDGE_TOP_K, JUDGE_TOP_P, ApiKey, BackendName, BaseUrl, Compress,
                               ContextLength, Device, EnableThinking, Inputs, MaxTokens, Model,
                               Out, Overwrite, PolicyName, PromptsDir, SamplingSeed,
                               SamplingSeedMode, Seed, Temperature, TopK, TopP, backend_spec)


def register(app: typer.Typer) -> None:
    app.command("audit")(audit)


def audit(
    inputs: Inputs = ["-"],
    out: Out = "-",
    designs: Annotated[list[str] | None, typer.Option(
        metavar="PATH", help="Design shards the envs came from: a reject then names its slot, "
                             "so `spade design --retry` redesigns it.")] = None,
    backend: BackendName = "hf",
    model: Model = ...,
    policy: PolicyName = None,
    temperature: Temperature = 0.3,
    top_p: TopP = JUDGE_TOP_P,
    top_k: TopK = JUDGE_TOP_K,
    enable_thinking: EnableThinking = None,
    max_tokens: MaxTokens = 4096,
    context_length: ContextLength = None,
    seed: Seed = 0,
    sampling_seed: SamplingSeed = SamplingSeedMode.request,
    prompts: PromptsDir = None,
    base_url: BaseUrl = None,
    api_key: ApiKey = None,
    device: Device = None,
    overwrite: Overwrite = False,
    compress: Compress = "jsonl",
) -> None:
    """Ask a model whether each env can be won; reject the ones it finds impossible.

    The reference's solvability audit for tool-use envs (lenient: only an explicit \\boxed{no}
    rejects). Reads env records; writes the accepted ones with `meta.audit`, and a validation
    record (check `audit`) for each reject.

    Examples:

        spade audit runs/q/r00/validate-a0 --designs runs/q/r00/design-a0 -m runs/q/model -o audited/
        spade validate envs/ | spade audit -m /models/Qwen3-4B --backend vllm
    """
    from spade_cli.errors import errors_to_exit
    from spade_cli.inputs import find_inputs
    from spade_cli.options import StageBackend
    from spade_cli.summary import summarize
    from stages import audit as stage
    from stages.backends import Sampling
    from stages.shards import Stats, find_shards, read, run_stage

    with errors_to_exit("audit"):
        spec = backend_spec(backend, model, base_url, api_key, device, context_length, policy)
        cfg = stage.Config(prompts_dir=prompts, sampling=Sampling(
            temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens, seed=seed,
            enable_thinking=enable_thinking, per_request_seed=sampling_seed.per_request))
        shards = find_inputs("audit", inputs, {"env"}, "env records")
        known = list(read([s.path for s in find_shards(designs or [], {"design"})],
                          kinds={"design"}))
        stats = Stats()
        model_backend = StageBackend(spec)

        def transform(envs):
            for record in stage.run([*known, *envs], model_backend.get(), cfg):
                if record.kind == "validation":
                    stats.reasons["audit"] += 1
                yield record

        config = {"backend": backend, "model": model, "temperature": temperature,
                  "top_p": top_p, "top_k": top_k, "enable_thinking": enable_thinking,
                  "max_tokens": max_tokens, "seed": seed, **sampling_seed.config(),
                  "prompts": prompts,
                  "designs": [s.digest() for s in find_shards(designs or [], {"design"})]}
        with model_backend:
            run_stage("audit", shards, out, transform, config, stats, kinds={"env"},
                      overwrite=overwrite, suffix=f".{compress}")
        summarize("audit", stats, f"{stats.written['env']} accepted, "
                                  f"{stats.written['validation']} judged unwinnable")
