"""``python -m dflashd``: the same command line as ``dflashd``."""

from dflashd.supervisor.__main__ import main

main(prog_name="dflashd")
