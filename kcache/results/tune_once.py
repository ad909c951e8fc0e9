"""Tune once: for one tune identity, one process per machine and one node per cluster tunes; every
other process waits for that tune and loads its result.

- On a machine, the identity's file lock (`<root>/.locks/tune-<key>.lock`) decides who tunes. The
  kernel drops it when its holder dies (SIGKILL included), and one waiter takes over.
- In a cluster (KCACHE_REMOTE), the lock's holder looks in the remote tier for the result, then takes
  the identity's lease there (renewed while it tunes), or waits for the node that holds it
  (RemoteTiers.claim: bounded, backing off). A node that dies stops renewing, its lease lapses, and
  another node takes over; a lease that is not a valid one is taken over at once.
- The holder writes a note in its lock file (pid, host, since when, how far it got). Waiters show
  it while they wait, so a rank that waits says whom for.
- Waiting is bounded by KCACHE_TUNE_WAIT, on the local lock and the remote lease together: past it,
  TuneWaitTimeout names the holder and the setting.
- A forced re-tune (`fetch_remote=False`) never takes another node's result, and its upload replaces
  the remote result, in every tier.

The same claim serves `autotuner.tune` and TileLang's AutoTuner under `kcache.install()`.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from kcache.errors import CacheLockTimeout, KCacheError
from kcache.store import access, layout
from kcache.store.entries import EntryStore
from kcache.store.locks import NOT_A_LOCK_FILE_ERRNOS, KeyLock, read_note

if TYPE_CHECKING:
    from kcache.tiers.remote_chain import RemoteLease, RemoteTiers

log = logging.getLogger("kcache")

Result = TypeVar("Result")
# How often a waiter says again that it still waits, and how far the tuner got.
PROGRESS_EVERY_S = 15.0
HELD, APPEARED, UNAVAILABLE = "held", "appeared", "unavailable"


class TuneWaitTimeout(KCacheError, TimeoutError):
    """Another process or node tuned the same identity for longer than KCACHE_TUNE_WAIT."""

    def __init__(self, name: str, identity: str, waited_s: float, holder: str) -> None:
        self.name = name
        self.identity = identity
        self.waited_s = waited_s
        self.holder = holder
        self._init_args = (name, identity, waited_s, holder)
        super().__init__(
            f"waited {waited_s:.0f} s for {holder} to finish tuning {name} (tune {identity[:16]}), longer "
            f"than KCACHE_TUNE_WAIT allows. Raise KCACHE_TUNE_WAIT (seconds) if tunes of this size take "
            f"longer, or find out why that tune does not finish.")


@dataclass
class HolderNote:
    """What a tune's holder says of itself, in its lock file."""

    pid: int
    host: str
    since: float
    name: str
    phase: str = "starting"
    done: int = 0
    total: int = 0

    def encode(self) -> bytes:
        return json.dumps(vars(self)).encode()

    @classmethod
    def decode(cls, data: bytes) -> HolderNote | None:
        try:
            fields = json.loads(data)
            return cls(pid=int(fields["pid"]), host=str(fields["host"])[:100], since=float(fields["since"]),
                       name=str(fields["name"])[:200], phase=str(fields["phase"])[:40], done=int(fields["done"]),
                       total=int(fields["total"]))
        except (ValueError, KeyError, TypeError):
            return None  # no note yet (the holder just took the lock), or one that is not ours to show

    def describe(self) -> str:
        progress = f", {self.phase} {self.done}/{self.total}" if self.total else f", {self.phase}"
        started = time.strftime("%H:%M:%S", time.localtime(self.since))
        return f"pid {self.pid} on {self.host} (tuning since {started}{progress})"


class RemoteResults:
    """Autotune results in the remote tier: fetched into the local root, uploaded from it."""

    def __init__(self, tier: RemoteTiers, store: EntryStore, key: str) -> None:
        self.tier = tier
        self.store = store
        self.key = key

    def fetch(self) -> bool:
        """Whether a verified remote result was published into the local root."""
        return self.tier.fetch_into(self.store, self.key) is not None

    def upload(self, *, replace: bool = False) -> bool:
        """This result into every tier; `replace` (a forced re-tune): over the result there, too."""
        return self.tier.upload_from(self.store, self.key, replace=replace)


class TuneOnce(Generic[Result]):
    """The claim on tuning one identity.

        once = TuneOnce(root, identity, name, load=..., exists=..., wait_s=...)
        found = once.claim()        # another's result, or None: this process tunes
        if found is None:
            try: tune, save; once.progress(...) as it goes
            finally: once.release()

    `load()` returns the saved result or None; `exists()` says cheaply whether one may be there (it
    ends a wait, and `load` decides). `report(message, first)` shows waiting messages (default:
    `report_to_log`). `fetch_remote=False` (a forced re-tune) still takes the cluster's lease, but
    never takes another node's result for its own, and its `upload()` replaces the remote result.
    """

    def __init__(self, root: Path, identity: str, name: str, *, load: Callable[[], Result | None],
                 exists: Callable[[], bool], wait_s: float, remote: RemoteResults | None = None,
                 lease_s: float = 30.0, report: Callable[[str, bool], None] | None = None,
                 fetch_remote: bool = True) -> None:
        self.root = Path(root)
        self.identity = identity
        self.name = name
        self._load = load
        self._exists = exists
        self.wait_s = wait_s
        self._remote = remote
        self._lease_s = lease_s
        self._fetch_remote = fetch_remote  # False for a forced re-tune: it replaces the remote result
        self._report = report or report_to_log
        self.lock = KeyLock(self.root / layout.LOCKS / f"tune-{identity[:40]}.lock", identity)
        self._lease: RemoteLease | None = None
        self._note = HolderNote(os.getpid(), socket.gethostname(), time.time(), name)
        self.held = False  # this process holds the claim (it tunes)

    # ------------------------------------------------------------ claiming

    def claim(self) -> Result | None:
        """Wait until the result is there (returned) or the claim is this process's (None: tune).

        Raises TuneWaitTimeout past `wait_s`. A root whose lock cannot be taken (not writable, or
        something not ours where the lock goes) is warned about once, and this process tunes
        without the claim."""
        started = time.monotonic()
        deadline = started + self.wait_s
        while True:
            outcome = self._wait_for_local_lock(started, deadline)
            if outcome == UNAVAILABLE:
                return None
            if outcome == HELD:
                break
            # It appeared while we waited: loaded without the lock, as every waiter does at once.
            found = self._load()
            if found is not None:
                return found
            self._exists = lambda: False  # there but unreadable: take the lock and tune it again
        try:
            found = self._load()
            if found is not None:
                self._release_lock()
                return found
            if self._remote is not None:
                found = self._claim_in_cluster(started, deadline)
                if found is not None:
                    self._release_lock()
                    return found
        except BaseException:
            self.release()
            raise
        self.held = True
        self.lock.write_note(self._note.encode())
        return None

    def _wait_for_local_lock(self, started: float, deadline: float) -> str:
        """HELD once the lock is ours; APPEARED when a result appeared meanwhile; UNAVAILABLE if the
        lock cannot be taken at all (then this process tunes without it)."""
        reported = False
        while True:
            slice_s = 0.0 if not reported else max(0.0, min(PROGRESS_EVERY_S, deadline - time.monotonic()))
            try:
                waited = self.lock.acquire(slice_s, self._exists)
            except CacheLockTimeout:
                if time.monotonic() >= deadline:
                    raise TuneWaitTimeout(self.name, self.identity, time.monotonic() - started,
                                          self._holder()) from None
                self._report_waiting(started, first=not reported)
                reported = True
                continue
            except OSError as err:
                if err.errno not in access.UNWRITABLE_ERRNOS | NOT_A_LOCK_FILE_ERRNOS:
                    raise
                log.warning("kcache: cannot take the tune lock %s (%s): tuning %s without it, so another "
                            "process may tune it too. Check the owner and mode of %s.", self.lock.path,
                            err.strerror or err, self.name, self.root)
                return UNAVAILABLE
            return HELD if waited is not None else APPEARED

    def _claim_in_cluster(self, started: float, deadline: float) -> Result | None:
        """Under the local lock: the remote result, or the cluster's lease (None: tune), or the result of
        the node that held it, within what is left of KCACHE_TUNE_WAIT. No tier answering means: tune
        here."""
        assert self._remote is not None
        remote = self._remote

        def look() -> Result | None:
            return self._load() if self._fetch_remote and remote.fetch() else None

        def waiting() -> None:
            self._report(f"kcache: another node holds the tune lease of {self.name} in {remote.tier.url}; waiting "
                         f"for its result (KCACHE_TUNE_WAIT={self.wait_s:g} s)", True)

        claim = remote.tier.claim(remote.key, self._lease_s, deadline - time.monotonic(), look, on_wait=waiting)
        if claim.timed_out:
            raise TuneWaitTimeout(self.name, self.identity, time.monotonic() - started,
                                  f"the node holding the lease in {remote.tier.url}")
        self._lease = claim.lease
        return claim.found

    # ------------------------------------------------------------ while tuning

    def progress(self, phase: str, done: int, total: int) -> None:
        """The holder's progress, for waiters to show."""
        if self.held and self.lock.is_locked:  # not in a fork of the holder (kcache.store.held_locks)
            self._note.phase, self._note.done, self._note.total = phase, done, total
            self.lock.write_note(self._note.encode())

    def upload(self) -> None:
        """After the holder saved its result: into the remote tier, for the other nodes."""
        if self._remote is not None:
            self._remote.upload(replace=not self._fetch_remote)

    def release(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.release()
        self._release_lock()

    def _release_lock(self) -> None:
        self.held = False
        if self.lock.is_locked:
            self.lock.release()

    # ------------------------------------------------------------ waiting messages

    def _holder(self) -> str:
        note = HolderNote.decode(read_note(self.lock.path))
        return note.describe() if note is not None else "another process"

    def _report_waiting(self, started: float, *, first: bool) -> None:
        waited = time.monotonic() - started
        if first:
            self._report(f"kcache: {self._holder()} is tuning {self.name}; waiting for its result "
                         f"(KCACHE_TUNE_WAIT={self.wait_s:g} s)", True)
        else:
            self._report(f"kcache: still waiting for {self._holder()} ({waited:.0f} s)", False)


def report_to_log(message: str, first: bool) -> None:
    """The first waiting message is a warning (a process that waits says whom for); later ones are info."""
    log.log(logging.WARNING if first else logging.INFO, "%s", message)
