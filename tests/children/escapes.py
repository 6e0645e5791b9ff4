"""Prints terminal escape sequences: a window title, a screen clear, a bell."""

print("before \x1b]0;pwned title\x07 \x1b[2J\x1b[H after", flush=True)
