"""What decides (pure): a run's end, the restart policy, incidents, hangs, goodput, the
verdicts and the effects the decisions return.  No clock, no I/O: tested as tables."""
