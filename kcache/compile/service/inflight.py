"""Identical jobs in flight run once in the compile service: the others get a copy of its output.

A compile job names its output (`JobOutput`: the cache key, and the staging directory it writes the
entry into). The key's file lock already makes one compile per key and root; what it cannot merge is
the same key compiled for different roots, or for no root at all (`KCACHE_READONLY`, compiles that
write nothing under the root), where every process would compile. Here the first job of a key
leads; a job of the same key and trust domain (`trust_domain`: only outputs that no one but this
user could have changed cross roots) that arrives while the leader is queued or running follows it: when
the leader's job succeeds, the server copies the leader's files into each follower's directory
(before the leader's client hears of it, so the leader's directory is still whole: its client
publishes it by a rename once told), then answers every one with the leader's result. A leader that
failed with a compile error passes that error on (the same key compiles the same way); a leader
that was aborted (its client went away), or a copy that fails, sends the follower's own job to the
pool instead. A job whose output is its result alone (no directory) shares just that.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

COPY_CHUNK = 1 << 20


@dataclass
class Follower:
    directory: str | None
    answer: Callable[[Any, BaseException | None], None]  # (result, error)
    run_own: Callable[[], None]  # send its own job to the pool instead


@dataclass
class Leader:
    directory: str | None
    followers: list[Follower] = field(default_factory=list)


class InflightOutputs:
    """The leaders of the keys in flight, and who follows them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._leaders: dict[str, Leader] = {}
        self.merged = 0  # jobs that followed a leader instead of compiling

    def lead_or_follow(self, key: str, directory: str | None, follower: Follower) -> bool:
        """True: the job leads (run it). False: it follows the key's leader (do not run it). `key`
        is then the merge key, to `finish` with."""
        with self._lock:
            leader = self._leaders.get(key)
            if leader is None:
                self._leaders[key] = Leader(directory)
                return True
            leader.followers.append(follower)
            self.merged += 1
            return False

    def finish(self, key: str, result: Any, error: BaseException | None, rerun: bool) -> Callable[[], None]:
        """The leader of `key` finished: copy its output to its followers now; returns what answers
        them, to be called once the leader itself has been answered. `rerun`: the leader's outcome
        says nothing about the job (it was aborted): the followers run their own."""
        with self._lock:
            leader = self._leaders.pop(key, None)
        if leader is None or not leader.followers:
            return lambda: None
        answers: list[Callable[[], None]] = []
        for follower in leader.followers:
            if rerun:
                answers.append(follower.run_own)
            elif error is not None:
                answers.append(lambda f=follower: f.answer(None, error))
            else:
                try:
                    if leader.directory is not None and follower.directory is not None:
                        copy_output(leader.directory, follower.directory)
                    elif leader.directory != follower.directory:  # one key, one kind of output
                        raise OSError(f"outputs of one key differ: {leader.directory} and {follower.directory}")
                except OSError:
                    answers.append(follower.run_own)  # its own compile, then: never a half copy
                    continue
                answers.append(lambda f=follower: f.answer(result, None))

        def answer_all() -> None:
            for answer in answers:
                answer()

        return answer_all

    def in_flight(self) -> int:
        with self._lock:
            return len(self._leaders)


def merge_key(key: str, directory: str | None) -> str:
    """The key under which identical jobs merge: the job's key and its output's trust domain."""
    return f"{key} in {trust_domain(directory)}"


def trust_domain(directory: str | None) -> str:
    """"private" for an output that nobody but this user can change while it is staged: a directory
    of this user's, writable by nobody else, every directory above it so too or sticky (a private
    root's staging, a private temporary directory); outputs of that domain may be copied into each other.
    Any other output (a group root's staging, writable by the group while staged) is its own
    domain, its staging parent: its files are copied only within its root, never into a private one
    (nor is a private output copied into a group root: that would need no trust, but gains little)."""
    if directory is None:
        return "private"  # the result alone: it crosses nothing but this service's own reply
    path = os.path.abspath(directory)
    parent = os.path.dirname(path)
    try:
        mine = os.stat(path, follow_symlinks=False)
        uid = os.geteuid()
        alone = stat.S_ISDIR(mine.st_mode) and mine.st_uid == uid and not mine.st_mode & 0o022
        if alone and _nobody_else_can_move(parent, uid):
            return "private"
    except OSError:
        pass
    return f"root {os.path.realpath(parent)}"


def _nobody_else_can_move(directory: str, uid: int) -> bool:
    """Whether no other user can rename or replace anything in `directory` or above it: every level,
    up to /, is sticky or is this user's or root's and writable by nobody else. (Another user who
    may write an ancestor could move the staging directory away and put one of theirs in its place.)"""
    level = directory
    while True:
        info = os.stat(level)
        if not (info.st_mode & stat.S_ISVTX or (info.st_uid in (uid, 0) and not info.st_mode & 0o022)):
            return False
        above = os.path.dirname(level)
        if above == level:
            return True
        level = above


def copy_output(source: str, target: str) -> None:
    """Every regular file of `source` into `target` (same names, modes and bytes, fsynced), through
    descriptors opened without following links: a link in either directory is an error, not a
    path to write through."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    source_fd = os.open(source, flags)
    try:
        target_fd = os.open(target, flags)
        try:
            for name in os.listdir(source_fd):
                _copy_file(source_fd, target_fd, name)
            os.fsync(target_fd)
        finally:
            os.close(target_fd)
    finally:
        os.close(source_fd)


def _copy_file(source_fd: int, target_fd: int, name: str) -> None:
    reader = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=source_fd)
    try:
        info = os.fstat(reader)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{name} in the leader's output is not a regular file")
        writer = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=target_fd)
        try:
            while chunk := os.read(reader, COPY_CHUNK):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(writer, view):]
            # The modes the follower's own job would have written: jobs merge only under one umask
            # (service.client), and KCACHE_UMASK and KCACHE_GROUP are part of the service's name.
            os.fchmod(writer, stat.S_IMODE(info.st_mode))
            os.fsync(writer)
        finally:
            os.close(writer)
    finally:
        os.close(reader)
