"""``python -m dflashd.supervisor`` is the ``dflashd`` command (the detached daemon re-executes it)."""

from dflashd.supervisor.client.cli import main

main()
