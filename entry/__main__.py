"""``python -m dflashd``: the same command line as ``dflashd``."""

from dflashd.supervisor.client.entrypoint import main

main(prog_name="dflashd")
