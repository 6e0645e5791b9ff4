"""The client: the ``dflashd`` commands, run in the user's process, never in the daemon.

It reads the home (state.json, the logs) and talks to the daemon through control.sock;
nothing in the daemon imports from here.
"""
