"""The command line's contract with people and scripts: its exit statuses, the one line a failed
command prints on stderr, the one JSON shape of that failure under `--json`, and the check that the
root a command reads exists (and is left uncreated when it does not)."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

from kcache.redaction import masked
from kcache.store.access import unreadable_fix, unreadable_reason

# 0: the command did what it was asked, and found nothing wrong.
EXIT_OK = 0
# 1: the command ran, and its answer is "no": what it was pointed at is not there (a root that does
# not exist, no single key matching a prefix) or it found a problem it leaves (a bad entry, a doctor's
# finding, a recorded key that would compile, a compile service not running).
EXIT_NOT_FOUND = 1
# 2: kcache could not run the command as written: a usage error (an unknown command or option, a
# missing or malformed argument), a bad KCACHE_* value, a root that is not a directory, an input it
# refuses (an unsigned bundle), an error of the filesystem.
EXIT_USER_ERROR = 2
EXIT_BROKEN_PIPE = 141  # stdout closed early (`kcache ls | head`): 128 + SIGPIPE, as a shell reports it

# What `kcache help` prints under the commands (docs/operations.md says the same, with examples).
EXIT_STATUS_HELP = """exit status:
  0         done, and nothing wrong
  1         done, and the answer is no: the root does not exist, no single key matches,
            or a problem is left (a bad entry, a doctor's finding, a key that would compile)
  2         the command could not run as written: a usage error, a bad KCACHE_* setting,
            a root that is not a directory, an input it refuses
  130, 143  interrupted (SIGINT, SIGTERM)
  141       stdout closed early (kcache ls | head)
A failure is one line on stderr; with --json, stdout also carries
{"error": LINE, "path": PATH or null, "exit_status": N}."""


class UserMistake(Exception):
    """Something the user can fix (the message says what and how), not a bug: one line, no traceback,
    exit status 2. `path` is the file or directory it is about, where there is one."""

    exit_status = EXIT_USER_ERROR

    def __init__(self, message: str, path: str | Path | None = None) -> None:
        super().__init__(message)
        self.path = None if path is None else str(path)


class NotFound(UserMistake):
    """What the command was pointed at is not there (a root, a key): exit status 1."""

    exit_status = EXIT_NOT_FOUND


class Unreadable(UserMistake):
    """The root is there, but this user cannot read it (another uid's 0700 root): exit status 1."""

    exit_status = EXIT_NOT_FOUND


class NotStarted(UserMistake):
    """A service the command was to start did not start (its one line says why): exit status 1."""

    exit_status = EXIT_NOT_FOUND


def require_root(root: Path) -> None:
    """The root a command reads must be a directory this user can read, and is never created here: a
    missing one is NotFound (a mistyped --dir must not look like an empty cache), one that is not a
    directory a UserMistake, one closed to this user (another uid's 0700 root) Unreadable."""
    if root.is_symlink() and not root.exists():
        raise UserMistake(f"the cache root {root} is a dangling symbolic link: point KCACHE_DIR or --dir at a "
                          "directory", root)
    if not root.exists():
        raise NotFound(f"no kcache root at {root}: check --dir and KCACHE_DIR (kcache creates a root at its first "
                       "compile; `kcache doctor --fix` creates it now)", root)
    if not root.is_dir():
        raise UserMistake(f"the cache root {root} is not a directory (a {_kind(root)}): point KCACHE_DIR or --dir "
                          "at a directory", root)
    unreadable = unreadable_reason(root)
    if unreadable:
        raise Unreadable(f"cannot read the kcache root {root}: {unreadable}; fix: {unreadable_fix(root)}", root)


def _kind(path: Path) -> str:
    mode = path.stat().st_mode
    return {stat.S_IFREG: "regular file", stat.S_IFIFO: "FIFO", stat.S_IFSOCK: "socket",
            stat.S_IFCHR: "character device", stat.S_IFBLK: "block device"}.get(stat.S_IFMT(mode), "non-directory")


def one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    if isinstance(err, OSError) and err.filename and str(err.filename) not in text:
        text = f"{err.filename}: {text}"
    return masked(text)  # a message quoting KCACHE_REMOTE (redis-py's, say) keeps its password to itself


def error_path(err: BaseException) -> str | None:
    if isinstance(err, UserMistake):
        return err.path
    if isinstance(err, OSError) and err.filename:
        return str(err.filename)
    return None


def report_failure(err: BaseException, as_json: bool) -> int:
    """Print a failed command's one line on stderr (and, with --json, its JSON on stdout); its exit status."""
    status = err.exit_status if isinstance(err, UserMistake) else EXIT_USER_ERROR
    line = one_line(err)
    print(f"kcache: {line}", file=sys.stderr)
    if as_json:
        print(json.dumps({"error": line, "path": error_path(err), "exit_status": status}, indent=1))
    return status
