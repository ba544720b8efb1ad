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
