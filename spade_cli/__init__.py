"""spade: SPADE self-play as composable shell stages. The typer app lives in spade_cli.app."""

__version__ = "0.1.0"
