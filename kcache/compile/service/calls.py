"""The compile service's relay of a job's calls to its client (the caller's callbacks, called there)."""

from __future__ import annotations

import threading
from typing import Any

from kcache.compile import protocol as wire

# How long a worker's call waits for its client's answer. A postproc callback edits a source string
# (milliseconds); a client that does not answer (stopped, or stuck in its callback) must not hold a
# worker and a compile slot of every client's for ever: the job fails instead.
ANSWER_TIMEOUT_S = 600.0


class CallRelay:
    """A client's side of its jobs' calls to it: a worker's call (name, pickled args) is sent to the
    client as ("call", job id, name, args), and the pool's thread running the job waits for the
    client's ("return", job id, answer). Both travel unopened: this process imports nothing of
    what they are made of. One call at a time per job (its worker waits for the answer)."""

    def __init__(self, send: Any) -> None:
        self._send = send
        self._lock = threading.Lock()
        self._waiting: dict[int, tuple[threading.Event, list[bytes]]] = {}
        self._gone = False

    def for_job(self, job_id: int) -> Any:
        def call(name: str, args: bytes) -> bytes:
            answered, box = threading.Event(), []
            with self._lock:
                if self._gone:
                    return wire.answer_bytes((wire.RAISE, RuntimeError("the job's client went away")))
                self._waiting[job_id] = (answered, box)
            self._send(("call", job_id, name, args))
            # Set by answered(), or by close() when the client goes; bounded for a client that neither.
            if not answered.wait(ANSWER_TIMEOUT_S):
                with self._lock:
                    self._waiting.pop(job_id, None)
                return wire.answer_bytes((wire.RAISE, TimeoutError(
                    f"the job's client did not answer its call of {name} within {ANSWER_TIMEOUT_S:g} s")))
            return box[0]

        return call

    def answered(self, job_id: int, answer: bytes) -> None:
        with self._lock:
            waiting = self._waiting.pop(job_id, None)
        if waiting is not None:
            waiting[1].append(answer)
            waiting[0].set()

    def close(self) -> None:
        with self._lock:
            self._gone = True
            waiting, self._waiting = self._waiting, {}
        gone = wire.answer_bytes((wire.RAISE, RuntimeError("the job's client went away")))
        for answered, box in waiting.values():
            box.append(gone)
            answered.set()
