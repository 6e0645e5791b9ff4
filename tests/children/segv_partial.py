"""Prints a line without its newline, then segfaults."""

import ctypes
import sys

sys.stdout.write("half a line before the crash")
sys.stdout.flush()
ctypes.string_at(0)  # a real SIGSEGV: read address 0
