"""dflashd.supervisor: the daemon, its decisions and the ``dflashd`` command line."""

__version__ = "0.1.0"
