"""``python -m dflashd``: the same command line as ``dflashd``."""

from dflashd.supervisor.cli import main

main(prog_name="dflashd")
