"""Exits 3 without writing anything."""

import sys

sys.exit(3)
