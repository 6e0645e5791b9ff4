"""``python -m dflashd.supervisor`` is the ``dflashd`` command (the detached daemon re-executes it)."""

from dflashd.supervisor.client.entrypoint import main

main()
