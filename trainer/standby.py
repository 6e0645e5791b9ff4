"""The warm standby (issue 51): the next run's interpreter, its heavy imports done, waiting.

dflashd's daemon starts this file by path under the job's own Python, with the next run's
exact cwd and environment, while the current run trains::

    python [FLAGS] standby.py MANIFEST IMPORTS script PATH [ARG...]
    python [FLAGS] standby.py MANIFEST IMPORTS module NAME [ARG...]

It imports ``torch`` and ``IMPORTS`` (comma-separated: what the last run had loaded, and the
script's own top-level imports, never a module of the job's own directory), checks that CUDA
was not initialised and the environment not changed by them, writes ``MANIFEST`` (every
imported file with its mtime and size, for the daemon to see whether one changed since), and
waits for SIGUSR1.  Then it becomes the job: ``sys.argv``, ``sys.path[0]``, ``__main__``,
``__file__``, the exit code, an uncaught exception's traceback (from the job's own frames) and
a Ctrl-C's end are what ``python script.py`` or ``python -m module`` gives.  SIGTERM before
the go ends it (its default action).  As a script it must not import dflashd (the job's
environment may not have it): the standard library only.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import io
import json
import os
import signal
import sys
import threading
import traceback
import types
from typing import Any

GO = signal.SIGUSR1
MAX_IMPORTS = 64


def _local(name: str, roots: tuple[str, ...]) -> bool:
    """A module of the job's own (under its directory or cwd), or one not found: not imported."""
    try:
        spec = importlib.util.find_spec(name.split(".", maxsplit=1)[0])
    except (ImportError, ValueError):
        return True
    origin = getattr(spec, "origin", None) if spec is not None else None
    if spec is None or not origin or origin in ("built-in", "frozen"):
        return spec is None
    # the job's own: a module file or a package right in its directory (or cwd); a venv or a
    # site-packages below them is not the job's own
    real = os.path.realpath(origin)
    where = os.path.dirname(real)
    if os.path.basename(real) == "__init__.py":
        where = os.path.dirname(where)
    return where in roots


def _sets_environment(node: ast.AST) -> bool:
    """``os.environ[...] = ``, ``os.environ.update/setdefault(...)``, ``os.putenv(...)``."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Assign | ast.AugAssign):
            targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
            if any("environ" in ast.unparse(t) for t in targets):
                return True
        if isinstance(sub, ast.Call):
            called = ast.unparse(sub.func)
            if called.endswith(("environ.update", "environ.setdefault", "putenv")):
                return True
    return False


def script_imports(path: str) -> tuple[list[str], bool]:
    """The modules a script imports at its top level (its AST; nothing run), and whether its
    top level sets environment variables (an import-time setting such as OMP_NUM_THREADS
    would be read by a module the standby imported before it)."""
    try:
        with io.open_code(path) as fh:
            tree = ast.parse(fh.read(), path)
    except (OSError, SyntaxError, ValueError):
        return [], False
    names: list[str] = []
    sets_env = False
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module.split(".")[0])
        elif not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            sets_env = sets_env or _sets_environment(node)
    return names, sets_env


def _imported_files() -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not isinstance(path, str) or path in out:
            continue
        with contextlib.suppress(OSError):
            st = os.stat(path)
            out[path] = [st.st_mtime_ns, st.st_size]
    return out


def _write(manifest: str, data: dict[str, Any]) -> None:
    temp = f"{manifest}.{os.getpid()}.tmp"
    with open(temp, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    os.replace(temp, manifest)


def prepare(manifest: str, wanted: list[str], mode: str, target: str) -> None:
    """Import what the job will, then say so in the manifest (ready, or why not)."""
    roots = tuple(os.path.realpath(p) for p in {sys.path[0], os.getcwd()})
    env_before = dict(os.environ)
    sets_env = False
    if mode == "script":
        found, sets_env = script_imports(target)
        wanted = [*wanted, *found]
    imported: list[str] = []
    for name in dict.fromkeys(["torch", *wanted]):
        if len(imported) >= MAX_IMPORTS or _local(name, roots):
            continue
        try:
            importlib.import_module(name)
        except Exception:  # the job will meet the same error itself, cold
            continue
        imported.append(name)
    why = None
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if sets_env:
        why = "the script sets environment variables at its top level (import-time settings)"
    elif cuda is not None and cuda.is_initialized():
        why = "an import initialised CUDA"
    elif dict(os.environ) != env_before:
        why = "an import changed the environment"
    files = _imported_files()
    _write(
        manifest,
        {
            "pid": os.getpid(),
            "ready": why is None,
            "why": why,
            "imported": imported,
            "files": files,
            "threads": threading.active_count(),
        },
    )


def become(mode: str, target: str, args: list[str]) -> None:
    """Run the job as ``python script.py`` / ``python -m module`` would, in this process."""
    if mode == "module":
        sys.argv = [target, *args]
        import runpy

        runpy.run_module(target, run_name="__main__", alter_sys=True)
        return
    path = target if os.path.isabs(target) else os.path.join(os.getcwd(), target)
    sys.argv = [target, *args]
    with io.open_code(path) as fh:
        code = compile(fh.read(), path, "exec")
    main = types.ModuleType("__main__")
    from importlib.machinery import SourceFileLoader

    main.__dict__.update(
        __file__=path,
        __cached__=None,
        __builtins__=__builtins__,
        __loader__=SourceFileLoader("__main__", path),
        __spec__=None,
    )
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def _job_traceback(exc: BaseException) -> types.TracebackType | None:
    """The traceback from the job's own first frame (ours and runpy's left out)."""
    tb = exc.__traceback__
    here = os.path.realpath(__file__)
    while tb is not None and (
        os.path.realpath(tb.tb_frame.f_code.co_filename) == here
        or tb.tb_frame.f_code.co_filename.endswith(("runpy.py", "<frozen runpy>"))
    ):
        tb = tb.tb_next
    return tb


def main(argv: list[str]) -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {GO})
    manifest, wanted, mode, target, *args = argv
    if mode == "script":
        sys.path[0] = os.path.dirname(os.path.realpath(target))
    else:
        sys.path[0] = os.getcwd()
    prepare(manifest, [n for n in wanted.split(",") if n], mode, target)
    signal.sigwait({GO})
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {GO})
    try:
        become(mode, target, args)
    except SystemExit:
        raise
    except KeyboardInterrupt as exc:  # as the interpreter ends on an uncaught Ctrl-C
        exc.__traceback__ = _job_traceback(exc)
        traceback.print_exception(type(exc), exc, exc.__traceback__)
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException as exc:
        trimmed = _job_traceback(exc)
        exc.__traceback__ = trimmed  # the hook prints the exception's own traceback
        sys.excepthook(type(exc), exc, trimmed)
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
