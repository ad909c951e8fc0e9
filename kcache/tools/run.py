"""`kcache run`: an unmodified TileLang program, with kcache installed into TileLang."""

from __future__ import annotations

import argparse
import os
import runpy
import sys


def run_program(args: argparse.Namespace) -> int:
    """`kcache run SCRIPT [ARGS]` or `kcache run -m MODULE [ARGS]`: the program, unmodified, as
    `__main__`, with kcache installed into TileLang. The only command that imports TileLang."""
    module, program_args = None, list(args.argv)
    if args.module is not None:  # -m MODULE ARGS... (or -mMODULE, whose ARGS land in argv)
        module, program_args = (args.module[0], args.module[1:] + program_args) if args.module else ("", [])
    elif program_args[:1] == ["--"]:  # kcache run -- SCRIPT ARGS
        program_args = program_args[1:]
    if not module and not program_args:
        print("kcache run: name a script (kcache run train.py ...) or a module (kcache run -m pkg.main ...)",
              file=sys.stderr)
        return 2
    if args.dir:
        os.environ["KCACHE_DIR"] = args.dir
    os.environ["KCACHE_TILELANG"] = "1"  # the program's own children that import kcache install too
    from kcache.dropin import install

    install()
    if module:
        sys.argv = [module, *program_args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        sys.argv = program_args
        sys.path.insert(0, os.path.dirname(os.path.abspath(program_args[0])))  # as `python script.py` does
        runpy.run_path(program_args[0], run_name="__main__")
    return 0
