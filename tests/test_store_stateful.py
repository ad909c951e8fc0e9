"""A Hypothesis state machine over the entry store.

Invariant: a lookup returns a complete, verified entry exactly as some
writer staged it, or a miss, or (only after a deliberate corruption) a
CorruptEntry; never anything partial.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kcache.errors import CorruptEntry
from kcache.maintenance.gc import collect_garbage
from kcache.store.entries import PUBLISH_STEPS, EntryStore, PublishOutcome
from kcache.store.fsutil import write_durable
from kcache.store.layout import StagingName, this_host

REQUIRED = frozenset({"kernel.so", "params.json"})
KEYS = [f"{i:02x}" * 32 for i in range(4)]


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


DEAD_PID = _dead_pid()


class SimulatedCrash(BaseException):
    """Raised at a publish step; the staging is first copied aside as a dead writer's leftover."""


def payload(seed: int) -> dict[str, bytes]:
    return {"kernel.so": bytes([seed % 256]) * (100 + seed), "params.json": f'{{"seed": {seed}}}'.encode()}


class StoreMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="kcache-stateful-"))
        self.store = EntryStore(self.tmp, "kernels", REQUIRED)
        self.published: dict[str, dict[str, bytes]] = {}
        self.corrupted: set[str] = set()

    def teardown(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _fill(self, files: dict[str, bytes]):
        def fill(staging: Path) -> None:
            for name, data in files.items():
                write_durable(staging / name, data)
        return fill

    @rule(key=st.sampled_from(KEYS), seed=st.integers(0, 500))
    def publish(self, key: str, seed: int) -> None:
        outcome = self.store.publish(key, self._fill(payload(seed)))
        if key in self.published:
            assert outcome is PublishOutcome.LOST_RACE
        else:
            assert outcome is PublishOutcome.PUBLISHED
            self.published[key] = payload(seed)

    @rule(key=st.sampled_from(KEYS), seeds=st.tuples(st.integers(0, 500), st.integers(0, 500)))
    def concurrent_publish(self, key: str, seeds: tuple[int, int]) -> None:
        barrier = threading.Barrier(2)
        outcomes: dict[int, PublishOutcome] = {}

        def writer(seed: int) -> None:
            def fill(staging: Path) -> None:
                self._fill(payload(seed))(staging)
                barrier.wait()  # both staged before either renames
            outcomes[seed] = self.store.publish(key, fill)

        if seeds[0] == seeds[1]:
            seeds = (seeds[0], seeds[0] + 1)
        threads = [threading.Thread(target=writer, args=(s,)) for s in seeds]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [s for s, o in outcomes.items() if o is PublishOutcome.PUBLISHED]
        if key in self.published:
            assert winners == []
        else:
            assert len(winners) == 1
            self.published[key] = payload(winners[0])

    @rule(key=st.sampled_from(KEYS), seed=st.integers(0, 500), step=st.sampled_from(PUBLISH_STEPS))
    def crash_while_publishing(self, key: str, seed: int, step: str) -> None:
        staging_area = self.tmp / ".staging"

        def hook(name: str) -> None:
            if name != step:
                return
            if name != "renamed":
                mine = [p for p in staging_area.iterdir() if StagingName.parse(p.name).pid == os.getpid()]
                assert len(mine) == 1
                leftover = StagingName(key, this_host(), DEAD_PID, "crashed" + os.urandom(4).hex())
                shutil.copytree(mine[0], staging_area / str(leftover))
            raise SimulatedCrash(name)

        self.store.fault_hook = hook
        try:
            outcome = self.store.publish(key, self._fill(payload(seed)))
        except SimulatedCrash:
            pass
        else:
            # Only a lost race skips the "renamed" step.
            assert step == "renamed" and key in self.published and outcome is PublishOutcome.LOST_RACE
        finally:
            self.store.fault_hook = None
        if step == "renamed" and key not in self.published:
            self.published[key] = payload(seed)

    @rule(key=st.sampled_from(KEYS), how=st.sampled_from(["truncate", "flip", "delete"]))
    def corrupt_a_file(self, key: str, how: str) -> None:
        if key not in self.published or key in self.corrupted:
            return
        victim = self.store.entry_path(key) / "kernel.so"
        if how == "truncate":
            os.truncate(victim, max(victim.stat().st_size // 2, 0))
        elif how == "flip":
            data = bytearray(victim.read_bytes())
            data[0] ^= 0xFF
            victim.write_bytes(bytes(data))
        else:
            victim.unlink()
        self.corrupted.add(key)

    @rule(key=st.sampled_from(KEYS))
    def quarantine(self, key: str) -> None:
        moved = self.store.quarantine(key, "test")
        assert (moved is not None) == (key in self.published)
        self.published.pop(key, None)
        self.corrupted.discard(key)

    @rule()
    def gc(self) -> None:
        collect_garbage(self.tmp, staging_ttl_s=3600)
        staging = self.tmp / ".staging"
        assert not staging.exists() or os.listdir(staging) == []

    @rule(key=st.sampled_from(KEYS))
    def lookup(self, key: str) -> None:
        self._check(key)

    @invariant()
    def every_key_is_complete_or_missing(self) -> None:
        if hasattr(self, "store"):
            for key in KEYS:
                self._check(key)

    def _check(self, key: str) -> None:
        try:
            files = self.store.read(key)
        except CorruptEntry:
            assert key in self.corrupted
            return
        if files is None:
            assert key not in self.published
        else:
            assert key not in self.corrupted
            assert files == self.published[key]


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
