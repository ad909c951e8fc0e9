"""The `kcache` command's entry point (the console script, and `python -m kcache`).

`kcache run SCRIPT [ARGS]` starts the program without loading the rest of the command line, whose
imports cost about 0.1 s: `kcache run empty.py` is meant to cost what `python empty.py` does
(stress.bench's `run` scenario). Every other form, `kcache run -m`, `kcache run --dir` and the other
commands included, is kcache.cli.main's.
"""

from __future__ import annotations

import sys

EXIT_USER_ERROR = 2  # as kcache.cli.main's: a mistake the user can fix, one line on stderr


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    if len(arguments) >= 2 and arguments[0] == "run" and not arguments[1].startswith("-"):
        from kcache.cli.run import NoProgram, prepare
        from kcache.errors import SettingError

        try:
            program = prepare(None, arguments[1:], None)
        except (NoProgram, SettingError) as err:
            print(f"kcache: {err}", file=sys.stderr)
            return EXIT_USER_ERROR
        return program()
    from kcache.cli.main import main as command_line

    return command_line(argv)
