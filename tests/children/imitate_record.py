"""Prints a line that looks exactly like a dflashd exit record."""

print(
    '{"ts":"2026-01-01T00:00:00.000000Z","seq":1,"run":1,"src":"dflashd","event":"exit","verdict":"completed"}'
)
