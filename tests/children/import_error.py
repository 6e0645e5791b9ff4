"""Dies of an import error, as a trainer with a missing dependency does."""

print("loading trainer")
import dflashd_module_that_does_not_exist  # noqa: E402, F401
