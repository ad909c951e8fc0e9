"""`kcache` / `python -m kcache`: inspect, verify and prune a cache root; `kcache run` a program with kcache
for TileLang, Triton and Helion (into TileLang when the program imports it: `run` itself imports none of
the three)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kcache.cli import bundle as bundle_cli
from kcache.cli import clear as clear_cli
from kcache.cli import config as config_cli
from kcache.cli import help as cli_help
from kcache.cli import stats as stats_cli
from kcache.cli import why_miss as why_miss_cli
from kcache.cli.contract import EXIT_BROKEN_PIPE, UserMistake, report_failure, require_root
from kcache.cli.entries import cmd_ls, cmd_show, cmd_tunes
from kcache.cli.maintenance import cmd_doctor, cmd_gc, cmd_prune, cmd_untune, cmd_verify
from kcache.cli.parser import build_parser, join_dashed_values
from kcache.cli.server import cmd_server
from kcache.config import Settings, warn_unknown_settings
from kcache.errors import KCacheError
from kcache.interruption import Interrupted, interruptible
from kcache.setting_values import default_root, env_parsed, parse_flag

# Commands that read a root: on a missing one each says so in one line and exits 1, creating nothing
# (a mistyped --dir is no empty cache). `import` and `run` create theirs; `server` and `help` read none.
ROOT_READERS = frozenset({"stats", "ls", "show", "verify", "prune", "clear", "export", "verify-coverage", "why-miss",
                          "tunes", "untune", "gc", "doctor"})


def main(argv: list[str] | None = None) -> int:
    """Run one command, under the contract of kcache.cli.contract: a failure (a missing root, a
    bad setting or argument) is one line on stderr, with its JSON on stdout under --json, and exit
    status 1 or 2; `--debug` or KCACHE_DEBUG=1 shows its traceback. Bugs keep their tracebacks. SIGINT
    or SIGTERM stops the command (what it started stopped, what it half made removed) with one line on
    stderr and exit status 130 or 143."""
    arguments = sys.argv[1:] if argv is None else argv
    debug = "--debug" in arguments or _debug_setting()
    parsed: list[argparse.Namespace] = []  # the arguments, once parsed: whether a failure answers in JSON
    try:
        with interruptible():  # not `kcache run`'s program, which runs below with its own signals
            outcome = _run(arguments, parsed)
    except Interrupted as stop:
        # One line: what the command left (no bundle, nothing imported), and a shell's status for it.
        command = next((word for word in arguments if word in COMMANDS), "")
        print(f"kcache{' ' + command if command else ''}: interrupted by {stop.name}"
              + (f": {stop.done}" if stop.done else ""), file=sys.stderr)
        return stop.exit_status
    except BrokenPipeError:
        # Nothing more can be said on a closed stdout; point it at /dev/null so that the interpreter's
        # final flush does not complain either.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE
    except (UserMistake, KCacheError, ValueError, OSError) as err:
        if debug:
            raise
        # Before the arguments parse, --json counts where kcache's options go: not after `run`'s script.
        as_json = parsed[0].json if parsed else "--json" in arguments[:_program_start(arguments)]
        return report_failure(err, as_json)
    if callable(outcome):  # `kcache run`'s program: its own errors are no mistakes of kcache's usage
        return outcome()
    return outcome


def _debug_setting() -> bool:
    """KCACHE_DEBUG, a flag. One that is not is off here: the settings' check then says so in one line."""
    try:
        return bool(env_parsed("KCACHE_DEBUG", parse_flag, False))
    except ValueError:
        return False


def _program_start(arguments: list[str]) -> int:
    """Where `kcache run`'s program and its own arguments begin (the end when there is no `run`)."""
    return arguments.index("run") + 1 if "run" in arguments else len(arguments)


def _run(arguments: list[str], parsed: list[argparse.Namespace]) -> int | Callable[[], int]:
    """A command's exit status; for `run`, what runs the program (checked and prepared here)."""
    parser = build_parser()
    parser.json_requested = "--json" in arguments[:_program_start(arguments)]  # type: ignore[attr-defined]  # --version's
    args = parser.parse_args(join_dashed_values(arguments))
    parsed.append(args)
    if args.command == "help":
        return cli_help.show_help(parser, args.topic, args.json)
    if args.command == "run":
        from kcache.cli.run import prepare_program  # TileLang's hooks wait for the program's import

        return prepare_program(args)
    if args.command in ("doctor", "config"):
        settings = None  # they report bad settings and roots as findings: they must not stop on them
        root = Path(args.dir).expanduser() if args.dir else default_root()
        if args.command == "doctor" and not args.fix and not root.exists() and not root.is_symlink():
            require_root(root)  # --fix creates it
    else:
        settings = Settings.from_env(args.dir)
        warn_unknown_settings()  # `kcache doctor` reports them as findings instead
        if args.command in ROOT_READERS and not (args.command == "verify-coverage" and args.bundle):
            require_root(settings.root)
        elif settings.root.exists() or settings.root.is_symlink():
            require_root(settings.root)  # one that exists must be a directory, for every command
    run: Callable[[argparse.Namespace, Any], tuple[Any, str, int]] = COMMANDS[args.command]
    result, text, status = run(args, settings)
    print(json.dumps(result, indent=1, default=str) if args.json else text)
    sys.stdout.flush()  # a closed pipe shows here, inside main's handler
    return status


COMMANDS = {"stats": stats_cli.cmd_stats, "ls": cmd_ls, "show": cmd_show, "verify": cmd_verify, "prune": cmd_prune,
            "config": config_cli.cmd_config, "clear": clear_cli.cmd_clear, "export": bundle_cli.cmd_export,
            "import": bundle_cli.cmd_import,
            "verify-coverage": bundle_cli.cmd_verify_coverage, "why-miss": why_miss_cli.cmd_why_miss, "tunes": cmd_tunes,
            "untune": cmd_untune, "gc": cmd_gc, "doctor": cmd_doctor, "server": cmd_server}


if __name__ == "__main__":
    sys.exit(main())
