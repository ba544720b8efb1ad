"""Options shared by several commands, so each is spelled and documented once."""

from __future__ import annotations

from typing import Annotated

import typer

Inputs = Annotated[list[str], typer.Argument(
    help="Shards (.jsonl, .jsonl.gz, .jsonl.zst), directories of shards, or '-' for stdin.")]
Out = Annotated[str, typer.Option(
    "--out", "-o", help="'-' for stdout, or a directory for resumable sharded output.")]
Overwrite = Annotated[bool, typer.Option(
    "--overwrite", help="Redo shards a previous run already finished.")]
Compress = Annotated[str, typer.Option(
    "--compress", help="Shard file suffix in directory mode: jsonl, jsonl.gz or jsonl.zst.")]

BackendName = Annotated[str, typer.Option(
    "--backend", help="hf (transformers), vllm (GPU), or openai (any compatible server).")]
Model = Annotated[str, typer.Option(
    "--model", "-m", help="Model directory (hf, vllm) or the server's model name (openai).")]
BaseUrl = Annotated[str | None, typer.Option(
    "--base-url", help="openai backend: server URL (default $OPENAI_BASE_URL).")]
ApiKey = Annotated[str | None, typer.Option(
    "--api-key", help="openai backend: API key (default $OPENAI_API_KEY).")]
Device = Annotated[str | None, typer.Option("--device", help="hf backend: cpu, cuda, cuda:1.")]
Temperature = Annotated[float, typer.Option(help="Sampling temperature (0 = greedy).")]
TopP = Annotated[float, typer.Option(help="Nucleus sampling threshold.")]
TopK = Annotated[int, typer.Option(help="Top-k sampling (0 = off).")]
MaxTokens = Annotated[int, typer.Option(help="Most tokens one completion may have.")]
Seed = Annotated[int, typer.Option(help="Seed for sampling and for every random choice.")]
PromptsDir = Annotated[str | None, typer.Option(
    "--prompts", help="Directory of prompt files overriding the built-in ones by name.")]
Round = Annotated[int, typer.Option("--round", help="Co-training round these records belong to.")]


def backend_spec(backend: str, model: str, base_url: str | None, api_key: str | None,
                 device: str | None):
    from spade_cli.errors import UsageError
    from stages.backends import BackendSpec

    if backend not in ("hf", "vllm", "openai"):
        raise UsageError(f"--backend must be hf, vllm or openai, not {backend!r}")
    if not model:
        raise UsageError("--model is required")
    return BackendSpec(name=backend, model=model, base_url=base_url, api_key=api_key,
                       device=device)
