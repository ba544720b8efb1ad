"""spade: SPADE self-play as composable shell stages. The typer app lives in spade_cli.app."""

from stages import __version__

__all__ = ["__version__"]
