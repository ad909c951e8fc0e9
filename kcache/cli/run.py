"""`kcache run`: an unmodified program, with kcache for whatever compiler it uses, paid for when it uses it.

Triton's kernels and Helion's autotune picks go through kcache by environment variables (nothing of
theirs imported); TileLang's compiles from the moment the program imports TileLang (kcache.dropin.on_import).
`kcache run empty.py` imports neither, and runs where TileLang is not installed.
"""

from __future__ import annotations

import importlib.util
import os
import runpy
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from kcache import helion as kcache_helion
from kcache import triton as kcache_triton
from kcache.dropin.on_import import install_from_environment
from kcache.setting_values import DROPIN_ENV, check_settings
from kcache.triton import key_ahead

if TYPE_CHECKING:
    import argparse


class NoProgram(ValueError):
    """`kcache run` names no script or module, or one that is not there: the user's mistake, one line."""


def prepare_program(args: argparse.Namespace) -> Callable[[], int]:
    """`kcache run SCRIPT [ARGS]` or `kcache run -m MODULE [ARGS]`, as the CLI parsed it: see `prepare`."""
    module, program_args = None, list(args.argv)
    if args.module is not None:  # -m MODULE ARGS... (or -mMODULE, whose ARGS land in argv)
        module, program_args = (args.module[0], args.module[1:] + program_args) if args.module else ("", [])
    elif program_args[:1] == ["--"]:  # kcache run -- SCRIPT ARGS
        program_args = program_args[1:]
    return prepare(module, program_args, args.dir)


def prepare(module: str | None, program_args: list[str], root: str | None) -> Callable[[], int]:
    """Check that the program is there and every KCACHE_* setting (SettingError, one line: the program
    must not run, only to fail at its first compile or never hear of it), set kcache up for it
    (`install_on_import`), and return what runs it, unmodified, as `__main__`. The CLI calls that
    outside its handler of user mistakes, so the program's own exceptions keep their tracebacks (a
    FileNotFoundError of the program's is not a missing script)."""
    if not module and not program_args:
        raise NoProgram("run: name a script (kcache run train.py ...) or a module (kcache run -m pkg.main ...)")
    if module:
        # As `python -m` does: the working directory first on the program's path (never on kcache's own,
        # whose imports are done by now or come from its package).
        sys.path.insert(0, os.getcwd())
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
    if root:
        os.environ["KCACHE_DIR"] = root
    check_settings()
    install_on_import()

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


def install_on_import() -> None:
    """kcache for whatever the program uses, in this process and its children: Triton's cache manager and
    Helion's backend by their environment variables, unless the user named their own (and Triton's key
    of its installation computed once the program imports Triton, kcache.triton.key_ahead); TileLang's
    hooks once the program imports TileLang (KCACHE_TILELANG=1, which children that import kcache honour too).
    Nothing of TileLang, Triton or Helion is imported here, and none of them needs to be installed."""
    if kcache_triton.enable():
        key_ahead.when_triton_imported()  # Triton's key of its installation, before its first compile
    kcache_helion.enable()
    os.environ[DROPIN_ENV] = "1"
    install_from_environment()
