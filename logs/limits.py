"""The run log's bounds and name that the writer, the readers, the framer and the config share,
in a leaf (stdlib only)."""

from __future__ import annotations

from typing import Final

DEFAULT_BASENAME: Final = "dflashd.jsonl"  # the live file's name (readers need it, not the writer)
MIN_MAX_BYTES: Final = 1024  # a smaller bound would rotate on nearly every record
MIN_LINE_BYTES: Final = 4  # one UTF-8 character must fit in a piece of a line
