"""The caller's functions that a job calls while it runs elsewhere: called in the caller.

A compile worker (a fork of the caller, a worker of the process's pool, a worker of the compile
service) runs TileLang's compile; TileLang calls the user's post-processing callbacks in the middle
of it. Those are the caller's code: their side effects (a counter, a print, a file written) belong
to the caller's process, as with plain TileLang. So the worker calls them through its pipes
(`worker.call_caller`), and the caller answers: `CallerCalls` is that answer.

Where it runs: in the thread that waits for the job (`wait`), when one does (`JobRunner.run`, the
compile of `get_or_compile`): that is the caller's own thread, with its thread-locals (a `Target`
scope, say), as in plain TileLang. A job nobody waits for that way (`submit`) has its calls made by
the thread that delivers them (the pool's, the service client's reader).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

from kcache.compile import protocol as wire


class CallerCalls:
    """The functions, by name, a job may call in this process; callable as (name, args) -> reply."""

    def __init__(self, functions: Mapping[str, Callable[..., Any]]) -> None:
        self.functions = dict(functions)
        self._inbox: queue.SimpleQueue[tuple[str, bytes, threading.Event, list[bytes]] | None] = queue.SimpleQueue()
        self._waiting = False
        self._lock = threading.Lock()

    def __call__(self, name: str, args: bytes) -> bytes:
        """Call `name(*args)` here (`args` pickled), in the waiting thread if there is one; the
        pickled answer for the job."""
        with self._lock:
            waiting = self._waiting
        if not waiting:
            return self._call(name, args)
        done, box = threading.Event(), []
        self._inbox.put((name, args, done, box))
        done.wait()
        return box[0]

    def _call(self, name: str, args: bytes) -> bytes:
        function = self.functions.get(name)
        if function is None:
            return wire.answer_bytes((wire.RAISE, RuntimeError(f"the job called {name!r}, which its caller did not give it")))
        try:
            return wire.answer_bytes((wire.RETURN, function(*wire.cloudpickle.loads(args))))
        except BaseException as err:  # noqa: BLE001 - raised in the job, as in plain TileLang
            return wire.answer_bytes((wire.RAISE, err))

    def wait(self, future: Future[Any]) -> Any:
        """`future.result()`, answering the job's calls in this thread until it is done."""
        with self._lock:
            self._waiting = True
        future.add_done_callback(lambda _done: self._inbox.put(None))
        try:
            while not future.done():
                self._answer(self._inbox.get())
        finally:
            with self._lock:
                self._waiting = False
            self._drain()
        return future.result()

    def _answer(self, item: tuple[str, bytes, threading.Event, list[bytes]] | None) -> None:
        if item is not None:  # None: the job is done (its future's callback woke this thread)
            name, args, done, box = item
            box.append(self._call(name, args))
            done.set()

    def _drain(self) -> None:
        """Calls that came as the job ended: answered here, so that no delivering thread waits."""
        while True:
            try:
                self._answer(self._inbox.get_nowait())
            except queue.Empty:
                return
