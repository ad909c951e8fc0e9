"""Workers forked ahead of their jobs, and used ones let go of, off the pool threads' path.

A fork pool (the compile service's) gives every job a fresh worker. Made when a job ends, the next
job of that slot waits for the old worker's exit and a new fork: 8 ms on a 2-core machine, a median
of 12 ms on the H200 with 16 workers replaced every 0.3 s (issue 67: a 16th of the cores idle while
compiles queued). Here one thread of the pool keeps a few workers forked ahead from the same
template, and a slot whose job ended takes one at once and hands its used worker here, to be waited
for and reaped. A spare is what a worker forked on demand would be (the template does nothing but
fork, so every fork of it is alike) and, like it, serves one job. An idle spare holds about 1 MB of its
own (its pages are the template's until written): the memory budget, which counts the slots' workers,
leaves the spares out.

A spare is handed out only while the template that forked it is the pool's live one and the spare
still runs; any other is killed and the next one tried, or the slot forks its own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from kcache.compile.workers.worker_process import WorkerProcess
from kcache.errors import CompilePoolError

log = logging.getLogger("kcache")

JOIN_S = 10.0  # the longest close() waits for the thread (one fork, or one used worker's exit grace)


def spare_count(max_workers: int) -> int:
    """How many workers a fork pool keeps forked ahead: one per four slots, one to four. Four keep 16
    slots supplied (a fork is a few ms, a job a few hundred); each is an idle fork of the template,
    its pages shared."""
    return max(1, min(4, max_workers // 4))


class SpareWorkers:
    """`take()` a worker forked ahead (None: none ready), `retire(worker)` a used one. `fork` makes a
    worker from the pool's template (CompilePoolError where there is none); `current(worker)` says
    whether a spare is still fit to serve."""

    def __init__(self, fork: Callable[[], WorkerProcess], current: Callable[[WorkerProcess], bool], count: int) -> None:
        self._fork = fork
        self._current = current
        self.count = count
        self._cond = threading.Condition()
        self._ready: deque[WorkerProcess] = deque()
        self._retired: list[WorkerProcess] = []
        self._paused = False  # a fork failed: none is tried again until the next take
        self._closed = False
        self._thread: threading.Thread | None = None

    def take(self) -> WorkerProcess | None:
        """A spare fit to serve, or None; the thread is woken to fork its replacement."""
        while True:
            with self._cond:
                if self._closed:
                    return None
                self._start_thread()
                self._paused = False
                spare = self._ready.popleft() if self._ready else None
                self._cond.notify()
            if spare is None or (self._current(spare) and not spare.has_exited()):
                return spare
            spare.kill()  # its template was replaced, or it died with it

    def wait_ready(self, timeout_s: float) -> None:
        """Until every spare is forked and ready (or forking failed, or timeout_s passed): a pool's
        `warm`, which says its workers are ready, means its spares too."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._start_thread()
            self._paused = False
            self._cond.notify()
            while not self._closed and not self._paused and len(self._ready) < self.count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(left)

    def retire(self, worker: WorkerProcess) -> None:
        """A worker whose job is done: its job pipe closes now (it starts to exit), and this pool's
        thread waits for its exit and reaps it."""
        worker.send_exit()
        with self._cond:
            if not self._closed:
                self._retired.append(worker)
                self._start_thread()
                self._cond.notify()
                return
        worker.close()

    def close(self) -> None:
        """Stop the thread; the spares are killed, the retired workers waited for and reaped."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(JOIN_S)
        with self._cond:
            spares, retired = list(self._ready), self._retired
            self._ready.clear()
            self._retired = []
        for worker in spares:
            worker.kill()
        for worker in retired:
            worker.close()

    def _start_thread(self) -> None:
        if self._thread is None:  # under the condition's lock
            self._thread = threading.Thread(target=self._run, name="kcache-compile-spares", daemon=True)
            self._thread.start()

    def _wanted(self) -> bool:
        return not self._paused and len(self._ready) < self.count

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._retired and not self._wanted():
                    self._cond.wait()
                if self._closed:
                    return
                retired, self._retired = self._retired, []
                fork = self._wanted()
            if fork:  # first: a slot may be waiting for it; the retired ones only need reaping
                self._fork_one()
            for worker in retired:
                worker.close()

    def _fork_one(self) -> None:
        try:
            worker = self._fork()
        except (CompilePoolError, OSError) as err:
            log.debug("kcache: no spare compile worker (%s); slots fork their own", err)
            with self._cond:
                self._paused = True
                self._cond.notify_all()
            return
        with self._cond:
            if not self._closed:
                self._ready.append(worker)
                self._cond.notify_all()  # a `wait_ready`
                return
        worker.kill()
