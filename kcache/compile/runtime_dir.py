"""This user's private directory for the compile service's socket, lock and log, and the compile
slots' locks: one directory that every process of the user on this machine finds by itself.

In order, the first that is a real directory of this user that nobody else may enter:
1. `$XDG_RUNTIME_DIR/kcache`, where the runtime directory is ours and private (a login session);
2. `<tmp>/kcache-<uid>`, created 0700 (cron, ssh without a session, batch jobs, containers);
3. `<user cache dir>-run/<host>` (`~/.cache/kcache-run/<host>`: a long name shortened), created 0700.

The second is a predictable name in a shared directory: another user can create it first, and
with /tmp's sticky bit the victim cannot remove it. That user gains nothing (the directory fails
the check, so nobody ever connects to a socket in it), and no longer takes the service away: the
user's processes all fail the same check and all move to the third, which lives in the user's
home and which no other user can make. The host in its name keeps machines that share a home
apart (a Unix socket is of one machine). docs/security.md, "Availability", has the model.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import stat
import tempfile
from pathlib import Path

from kcache.store.user_dirs import user_cache_dir

log = logging.getLogger("kcache")

_warned: set[str] = set()


class NoServiceDirectory(OSError):
    """No private directory for the service's socket (the message says why, and what can be done)."""


def runtime_directory() -> Path:
    """This user's private directory for service sockets (created if missing). Raises
    NoServiceDirectory when no candidate is ours alone."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and _problem(Path(runtime)) is None:
        session = Path(runtime) / "kcache"
        if _make_private(session) is None:
            return session
    shared_tmp = Path(tempfile.gettempdir()) / f"kcache-{os.geteuid()}"
    refused = _make_private(shared_tmp)
    if refused is None:
        return shared_tmp
    home = Path(user_cache_dir("kcache") + "-run") / host_tag()
    with contextlib.suppress(OSError):
        home.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
    why_not_home = _make_private(home)
    if why_not_home is None:
        if str(shared_tmp) not in _warned:
            _warned.add(str(shared_tmp))
            log.warning("kcache: %s %s, so the compile service lives in %s instead (every process of this user "
                        "finds it there). The directory can be removed only by its owner or root; "
                        "XDG_RUNTIME_DIR set to a private directory of yours takes precedence over both.",
                        shared_tmp, refused, home)
        return home
    raise NoServiceDirectory(f"{shared_tmp} {refused}, and {home} {why_not_home}: no compile service (the "
                             "process's own pool compiles); set XDG_RUNTIME_DIR to a private directory of yours")


def host_tag(hostname: str | None = None) -> str:
    """This machine's name in the home directory's path: the host name where it is short, else its
    first label (8 bytes at most) and a hash of the whole name. A fully qualified name can be 253
    bytes, and a socket's whole path may be 107."""
    name = hostname if hostname is not None else socket.gethostname()
    if len(name) <= 16 and "." not in name and "/" not in name:
        return name
    return f"{name.split('.')[0][:8]}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def _make_private(directory: Path) -> str | None:
    """Create `directory` 0700 if missing; None if it is then ours alone, else what is wrong with it."""
    with contextlib.suppress(FileExistsError, FileNotFoundError, PermissionError):
        os.mkdir(directory, 0o700)
    return _problem(directory)


def _problem(directory: Path) -> str | None:
    """None for a real directory of this user that nobody else may enter or write, else what it is."""
    try:
        info = os.stat(directory, follow_symlinks=False)
    except OSError as err:
        return f"cannot be made ({err.strerror})"
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    if info.st_uid != os.geteuid():
        return f"belongs to uid {info.st_uid}, not to this user ({os.geteuid()})"
    if info.st_mode & 0o077:
        return f"is open to others (mode {stat.S_IMODE(info.st_mode):04o})"
    return None
