"""`python -m spade_cli` is the `spade` command."""

from spade_cli.app import main

main()
