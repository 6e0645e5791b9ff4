"""What talks to people and programs: the run log's one verb for a record, alerts,
runs.sqlite, state.json and status, Prometheus, the control socket and dflashd's own log."""
