"""The `kcache` command line's arguments: the parser of every command (`build_parser`), its options'
placement (`--dir` and `--json` before or after the command), and a bad argument as one line."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, NoReturn

from kcache.cli import clear as clear_cli
from kcache.cli import config as config_cli
from kcache.cli import help as cli_help
from kcache.cli import stats as stats_cli
from kcache.cli import why_miss as why_miss_cli
from kcache.cli.contract import EXIT_STATUS_HELP, UserMistake
from kcache.setting_values import parse_age, parse_size

# What `kcache --help` says the command is (kcache.cli.main's docstring says it too), in lines of its
# own: the formatter keeps the epilog's layout, so wraps no description.
DESCRIPTION = ("`kcache` / `python -m kcache`: inspect, verify and prune a cache root;\n"
               "`kcache run` a program with kcache for TileLang, Triton and Helion")


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a bad argument reported like every other mistake: one line (the usage is one
    `--help` away), exit status 2. No option matches by a prefix of its name (argparse's default does):
    `kcache stats --zer` would zero the counters, `kcache clear --all` remove every version's entries.
    Each command's parser is one of these too (add_subparsers makes its parsers of the main one's class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("kcache").strip()  # cli.main() prints "kcache: " first
        whole = self._whole_names(message)
        hint = f"options are spelled whole: did you mean {' or '.join(whole)}? " if whole else ""
        raise UserMistake(f"{command + ': ' if command else ''}{message} ({hint}see {self.prog} --help)")

    def _whole_names(self, message: str) -> list[str]:
        """The options, of this parser or its commands', that an unrecognized word begins (`--zer`: `--zero`)."""
        if not message.startswith("unrecognized arguments: "):
            return []
        parsers = [self, *(self._subparsers._group_actions[0].choices.values() if self._subparsers else ())]
        names = {option for parser in parsers for action in parser._actions for option in action.option_strings}
        words = [word.split("=", 1)[0] for word in message.removeprefix("unrecognized arguments: ").split()]
        return sorted({name for word in words if word.startswith("--") for name in names
                       if name.startswith(word) and name != word})


# Options whose value may look like an option to argparse ("--max-size -1G" would be "expected one
# argument"): such a value is joined to its option, so that the value's own parser names it.
VALUE_OPTIONS = ("--max-size", "--max-age")


def join_dashed_values(arguments: list[str]) -> list[str]:
    joined: list[str] = []
    index = 0
    while index < len(arguments):
        word = arguments[index]
        following = arguments[index + 1] if index + 1 < len(arguments) else None
        if word in VALUE_OPTIONS and following is not None and following[:2] != "--" and following.startswith("-"):
            joined.append(f"{word}={following}")
            index += 2
            continue
        joined.append(word)
        index += 1
    return joined


def build_parser() -> argparse.ArgumentParser:
    """`--dir` and `--json` go before the command, after it, or both (the one after it wins): the main
    parser holds them with their defaults, every command a copy whose default is SUPPRESS, so an option
    absent after the command leaves the one given before it. `run` passes whatever follows the script
    (or `-m MODULE`) to the program untouched."""
    parser = OneLineParser(prog="kcache", description=DESCRIPTION, parents=[_shared_options()],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="--dir and --json go before or after the command; given in both\n"
                                            "places, the one after the command wins.\n\n" + EXIT_STATUS_HELP)
    parser.add_argument("--version", action=cli_help.VersionAction,
                        help="print kcache's version, where it runs from, and exit")
    after = _shared_options(after_command=True)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str, **kwargs: Any) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=summary, description=summary, parents=[after], **kwargs)

    stats_cli.add_parser(command)
    command("ls", "key, kind, kernel, params (dtypes and shapes), out_idx, target, config, size, created, last used "
            "(recorded at most once an hour per entry, so it lags a use by up to an hour)")
    show = command("show", "one entry: a summary (kernel, key, params, target, created, size), its files, "
                   "then every detail of its meta.json")
    show.add_argument("key", help="a key or a unique prefix of one")
    verify = command("verify", "hash-check every entry")
    verify.add_argument("--repair", action="store_true", help="quarantine the bad ones (they recompile on next use)")
    prune = command("prune", "evict least recently used entries down to a size or age")
    prune.add_argument("--max-size", type=_argument(parse_size), default=argparse.SUPPRESS,
                       help="e.g. 5G; 0 means no limit (default: KCACHE_MAX_SIZE, 10G unless set)")
    prune.add_argument("--max-age", type=_argument(parse_age), default=argparse.SUPPRESS,
                       help="e.g. 30d, 12h, 90min; 0 means no limit (default: KCACHE_MAX_AGE, no limit unless set)")
    clear_cli.add_parser(command)
    export = command("export", "write kernel entries to one bundle file, signed with KCACHE_BUNDLE_SECRET")
    export.add_argument("bundle", help="the bundle file to write")
    export.add_argument("--keys", metavar="FILE", help="only these keys: one per line, or KCACHE_RECORD's JSON lines")
    export.add_argument("--arch", action="append", help="only entries built for this arch (repeatable), e.g. sm_90a")
    export.add_argument("--since", type=_argument(parse_age), help="only entries created within this age, e.g. 2h")
    bring = command("import", "verify a bundle whole (signature, every byte), then publish its entries here")
    bring.add_argument("bundle", help="the bundle file to read")
    bring.add_argument("--arch", action="append", help="only entries built for this arch (repeatable)")
    bring.add_argument("--unsigned", action="store_true",
                       help="accept an unsigned bundle (whoever wrote it is trusted with code)")
    bring.add_argument("--any-toolchain", action="store_true",
                       help="skip the check that the bundle was built by this toolchain (which imports TileLang)")
    coverage = command("verify-coverage", "check that a bundle (or the root) holds every recorded key: "
                       "what is missing would compile")
    coverage.add_argument("--keys", metavar="FILE", required=True, help="the keys (KCACHE_RECORD's file)")
    coverage.add_argument("bundle", nargs="?", help="a bundle file (default: the root, --dir)")
    why_miss_cli.add_parser(command)
    command("tunes", "saved autotune results: key, factory, best config, device, age")
    untune = command("untune", "remove a saved autotune result, so that the next tune of it runs again "
                     "(on this root; in a cluster use tune(force=True), which replaces the remote one too)")
    untune.add_argument("key", help="a result's key or a unique prefix of one (see `kcache tunes`)")
    command("gc", "staging, trash, stale locks, old quarantine, unused entries of other TileLang versions")
    check = command("doctor", "permissions, ownership, noexec, free space, toolchain, remote")
    check.add_argument("--fix", action="store_true", help="fix what can be fixed safely")
    server = command("server", "this user's compile service (KCACHE_COMPILE_ISOLATION=server): start, stop, status")
    server.add_argument("action", choices=("start", "stop", "status"))
    program = command("run", "run a Python program with kcache for TileLang (tilelang.compile, @tilelang.jit, "
                      "the AutoTuner's results: installed when the program imports TileLang), Triton (its "
                      "kernels, Inductor's too) and Helion (its autotune picks)",
                      usage="%(prog)s [-h] [--dir ROOT] [--json] (SCRIPT | -m MODULE) [ARGS ...]",
                      epilog="kcache's options go before the script or -m; everything after the script or "
                             "the module's name (--dir and --json included) is the program's.")
    # REMAINDER on both: whatever follows the script, or -m's module name, is the program's, even what
    # looks like one of kcache's options.
    program.add_argument("-m", dest="module", nargs=argparse.REMAINDER,
                         help="-m MODULE [ARGS ...]: run a module, as python -m does")
    program.add_argument("argv", nargs=argparse.REMAINDER, metavar="SCRIPT [ARGS ...]",
                         help="the script and its arguments")
    config_cli.add_parser(command)
    cli_help.add_parser(command)
    return parser


def _argument(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """`parse` as an argparse type: its own message (with examples), not "invalid parse_size value"."""

    def parsed(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    parsed.__name__ = parse.__name__.removeprefix("parse_")
    return parsed


def _shared_options(after_command: bool = False) -> argparse.ArgumentParser:
    """The options every command takes. After the command their default is SUPPRESS: an absent one
    must not overwrite the value given before the command."""
    options = argparse.ArgumentParser(add_help=False)
    unset: dict[str, Any] = {"default": argparse.SUPPRESS} if after_command else {}
    options.add_argument("--dir", metavar="ROOT", help="cache root (default: $KCACHE_DIR or the user cache directory)",
                         **unset)
    options.add_argument("--json", action="store_true", help="machine-readable output", **unset)
    options.add_argument("--debug", action="store_true", help="a traceback for errors (also KCACHE_DEBUG=1)", **unset)
    return options
