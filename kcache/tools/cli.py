"""`kcache` / `python -m kcache`: inspect, verify and prune a cache root; `kcache run` a TileLang program
with kcache installed (into TileLang when the program imports it: `run` itself imports none of it)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from kcache.config import Settings, warn_unknown_settings
from kcache.errors import CorruptEntry, KCacheError
from kcache.maintenance.eviction import evict, evict_entry, scan_entries
from kcache.maintenance.gc import collect_garbage, staging_dirs
from kcache.setting_values import default_root, parse_age, parse_size
from kcache.store import layout
from kcache.store.components import META
from kcache.store.elf import require_loadable
from kcache.store.locks import KeyLock
from kcache.tools import bundle_cli, clear_cli, cli_help, config_cli, stats_cli, why_miss_cli
from kcache.tools.cli_contract import (
    EXIT_BROKEN_PIPE,
    EXIT_STATUS_HELP,
    NotFound,
    UserMistake,
    report_failure,
    require_root,
)
from kcache.tools.cli_entries import (
    AUTOTUNER,
    autotune_results,
    cmd_ls,
    cmd_show,
    cmd_tunes,
    entry_meta,
    kernel_store,
)
from kcache.tools.cli_format import count_of, format_table, human_age, human_size, short_key
from kcache.tools.doctor import doctor, installed_tilelang
from kcache.tools.interruption import Interrupted, interruptible
from kcache.tools.server_cli import cmd_server

OTHER_VERSION_UNUSED_S = 7 * 86400


# Commands that read a root: on a missing one each says so in one line and exits 1, creating nothing
# (a mistyped --dir is no empty cache). `import` and `run` create theirs; `server` and `help` read none.
ROOT_READERS = frozenset({"stats", "ls", "show", "verify", "prune", "clear", "export", "verify-coverage", "why-miss",
                          "tunes", "untune", "gc", "doctor"})


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a bad argument reported like every other mistake: one line (the usage is one
    `--help` away), exit status 2."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("kcache").strip()  # main() prints "kcache: " first
        raise UserMistake(f"{command + ': ' if command else ''}{message} (see {self.prog} --help)")


def main(argv: list[str] | None = None) -> int:
    """Run one command, under the contract of kcache.tools.cli_contract: a failure (a missing root, a
    bad setting or argument) is one line on stderr, with its JSON on stdout under --json, and exit
    status 1 or 2; `--debug` or KCACHE_DEBUG=1 shows its traceback. Bugs keep their tracebacks. SIGINT
    or SIGTERM stops the command (what it started stopped, what it half made removed) with one line on
    stderr and exit status 130 or 143."""
    arguments = sys.argv[1:] if argv is None else argv
    debug = "--debug" in arguments or os.environ.get("KCACHE_DEBUG", "") not in ("", "0")
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


def _program_start(arguments: list[str]) -> int:
    """Where `kcache run`'s program and its own arguments begin (the end when there is no `run`)."""
    return arguments.index("run") + 1 if "run" in arguments else len(arguments)


def _run(arguments: list[str], parsed: list[argparse.Namespace]) -> int | Callable[[], int]:
    """A command's exit status; for `run`, what runs the program (checked and prepared here)."""
    parser = build_parser()
    args = parser.parse_args(join_dashed_values(arguments))
    parsed.append(args)
    if args.command == "help":
        return cli_help.show_help(parser, args.topic)
    if args.command == "run":
        from kcache.tools.run import prepare_program  # TileLang's hooks wait for the program's import

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


def build_parser() -> argparse.ArgumentParser:
    """`--dir` and `--json` go before the command, after it, or both (the one after it wins): the main
    parser holds them with their defaults, every command a copy whose default is SUPPRESS, so an option
    absent after the command leaves the one given before it. `run` passes whatever follows the script
    (or `-m MODULE`) to the program untouched."""
    parser = OneLineParser(prog="kcache", description=__doc__.splitlines()[0], parents=[_shared_options()],
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
    program = command("run", "run a Python program with kcache installed into TileLang "
                      "(tilelang.compile, @tilelang.jit, the AutoTuner's results)",
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


# ---------------------------------------------------------------- commands


def cmd_verify(args: argparse.Namespace, settings: Settings) -> tuple[Any, str, int]:
    from kcache.triton.store import store_of as triton_store_of

    bad = []
    keys = []
    # TileLang's kernels, then Triton's groups (kcache.triton), each under its own locks.
    for store in (kernel_store(settings), triton_store_of(settings.root)):
        for key in store.keys():
            keys.append(key)
            try:
                files = store.read(key)
                if files is not None and _is_tilelang_entry(files):
                    require_loadable(str(store.entry_path(key)), files)  # the hash can match a library cut short
            except CorruptEntry as corrupt:
                entry = {"key": key, "reason": corrupt.reason, "quarantined": None}
                if args.repair:
                    lock = KeyLock(store.root / layout.LOCKS / f"{key}.lock", key)
                    if lock.acquire(settings.lock_timeout_s) is not None:
                        with lock:
                            moved = store.quarantine(key, f"kcache verify: {corrupt.reason}")
                        entry["quarantined"] = str(moved) if moved else None
                bad.append(entry)
    in_progress = sum(len(os.listdir(d)) for d in staging_dirs(settings.root))
    result = {"entries": len(keys), "bad": bad, "staging_in_progress": in_progress}
    lines = [f"{count_of(len(keys), 'entry', 'entries')}, {len(keys) - len(bad)} good, {len(bad)} bad; "
             f"{count_of(in_progress, 'staging directory', 'staging directories')} (unpublished writes: never visible)"]
    lines += [f"  BAD {short_key(b['key'])}: {b['reason']}" + (f" -> {b['quarantined']}" if b["quarantined"] else "")
              for b in bad]
    if bad and not args.repair:
        lines.append("run `kcache verify --repair` to quarantine them; they recompile on next use")
    unrepaired = [b for b in bad if not b["quarantined"]]
    return result, "\n".join(lines), 1 if unrepaired else 0


def cmd_prune(args: argparse.Namespace, settings: Settings) -> tuple[Any, str, int]:
    # An option left out takes the setting; one given as 0 parses to None, no limit, and must not.
    max_size = getattr(args, "max_size", settings.max_size_bytes)
    max_age = getattr(args, "max_age", settings.max_age_s)
    report = evict(settings.root, max_size, max_age)
    result = {"evicted": report.evicted, "freed_bytes": report.freed_bytes, "remaining": report.remaining,
              "remaining_bytes": report.remaining_bytes, "max_size_bytes": max_size, "max_age_s": max_age}  # None: no limit
    limits = (f"size {human_size(max_size) if max_size is not None else 'no limit'}, "
              f"age {human_age(max_age) if max_age is not None else 'no limit'}")
    return result, (f"evicted {count_of(report.evicted, 'entry', 'entries')} ({human_size(report.freed_bytes)}); "
                    f"{report.remaining} remain ({human_size(report.remaining_bytes)}); limits: {limits}"), 0


def cmd_untune(args: argparse.Namespace, settings: Settings) -> tuple[Any, str, int]:
    matches = [p for p in autotune_results(settings.root) if p.name.startswith(args.key)]
    if len(matches) != 1:
        why = "no autotune result matches" if not matches else f"{len(matches)} autotune results match"
        raise NotFound(f"untune: {why} {args.key!r} under {settings.root / AUTOTUNER} (see `kcache tunes`)",
                       settings.root / AUTOTUNER)
    removed = evict_entry(settings.root, matches[0])
    return ({"removed": str(matches[0]) if removed else None},
            f"removed {matches[0]}: the next tune of it runs again" if removed else
            f"kcache: {matches[0]} was already gone", 0)


def cmd_gc(args: argparse.Namespace, settings: Settings) -> tuple[Any, str, int]:
    report = collect_garbage(settings.root, settings.staging_ttl_s, settings.max_size_bytes, settings.max_age_s,
                             quarantine_age_s=OTHER_VERSION_UNUSED_S)
    version = installed_tilelang()
    old_versions = 0
    if version is not None:
        now = time.time()
        for entry in scan_entries(settings.root):
            built_by = entry_meta(entry.path).get("tilelang")
            if built_by and built_by != version and now - entry.last_used > OTHER_VERSION_UNUSED_S:
                old_versions += evict_entry(settings.root, entry.path)
    result = {**vars(report), "other_versions_removed": old_versions}
    text = ", ".join(f"{name.replace('_', ' ')} {value}" for name, value in result.items())
    return result, text, 0


def cmd_doctor(args: argparse.Namespace, settings: Settings | None) -> tuple[Any, str, int]:
    # Settings are the doctor's to read: a bad one is a finding, not a stop (main passes None).
    findings = doctor(settings if settings is not None else args.dir, fix=args.fix)
    problems = [f for f in findings if f.problem and not f.fixed]
    rows = [("FIXED" if f.fixed else "PROBLEM" if f.problem else "ok", f.check,
             f.detail + (f"; fix: {f.fix}" if f.problem and not f.fixed and f.fix else ""))
            for f in findings]
    reported = [{k: v for k, v in vars(f).items() if k != "fix" or f.problem} for f in findings]
    return reported, format_table(["", "check", "detail"], rows), 1 if problems else 0


COMMANDS = {"stats": stats_cli.cmd_stats, "ls": cmd_ls, "show": cmd_show, "verify": cmd_verify, "prune": cmd_prune,
            "config": config_cli.cmd_config, "clear": clear_cli.cmd_clear, "export": bundle_cli.cmd_export,
            "import": bundle_cli.cmd_import,
            "verify-coverage": bundle_cli.cmd_verify_coverage, "why-miss": why_miss_cli.cmd_why_miss, "tunes": cmd_tunes,
            "untune": cmd_untune, "gc": cmd_gc, "doctor": cmd_doctor, "server": cmd_server}


# ---------------------------------------------------------------- helpers


def _is_tilelang_entry(files: dict[str, bytes]) -> bool:
    """Whether a verified entry is TileLang's (its library is dlopened: worth an ELF check); stress's
    synthetic entries hold random bytes there."""
    try:
        meta = json.loads(files[META])
    except (KeyError, ValueError):
        return False
    return isinstance(meta, dict) and "tilelang" in meta


if __name__ == "__main__":
    sys.exit(main())
