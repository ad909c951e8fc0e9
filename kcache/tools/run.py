"""`kcache run`: an unmodified TileLang program, with kcache installed into TileLang."""

from __future__ import annotations

import argparse
import importlib.util
import os
import runpy
import sys
from collections.abc import Callable


class NoProgram(ValueError):
    """`kcache run` names no script or module, or one that is not there: the user's mistake, one line."""


def prepare_program(args: argparse.Namespace) -> Callable[[], int]:
    """`kcache run SCRIPT [ARGS]` or `kcache run -m MODULE [ARGS]`: check that the program is there,
    install kcache into TileLang (the only command that imports it), and return what runs the
    program, unmodified, as `__main__`. The CLI calls that outside its handler of user mistakes, so
    the program's own exceptions keep their tracebacks (a FileNotFoundError of the program's is not
    a missing script)."""
    module, program_args = None, list(args.argv)
    if args.module is not None:  # -m MODULE ARGS... (or -mMODULE, whose ARGS land in argv)
        module, program_args = (args.module[0], args.module[1:] + program_args) if args.module else ("", [])
    elif program_args[:1] == ["--"]:  # kcache run -- SCRIPT ARGS
        program_args = program_args[1:]
    if not module and not program_args:
        raise NoProgram("run: name a script (kcache run train.py ...) or a module (kcache run -m pkg.main ...)")
    if module:
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError):  # a parent package that is missing, or an empty name
            found = None
        if found is None:
            raise NoProgram(f"run: no module named {module!r} on this Python's path ({sys.executable}): "
                            "check the name, or install the package")
    elif not os.path.isfile(program_args[0]):
        what = "a directory" if os.path.isdir(program_args[0]) else "no such file"
        raise NoProgram(f"run: {os.path.abspath(program_args[0])}: {what}; name the program's .py file")
    if args.dir:
        os.environ["KCACHE_DIR"] = args.dir
    os.environ["KCACHE_TILELANG"] = "1"  # the program's own children that import kcache install too
    from kcache.dropin import install

    install()

    def run() -> int:
        if module:
            sys.argv = [module, *program_args]
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            sys.argv = program_args
            sys.path.insert(0, os.path.dirname(os.path.abspath(program_args[0])))  # as `python script.py` does
            runpy.run_path(program_args[0], run_name="__main__")
        return 0

    return run
