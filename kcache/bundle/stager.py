"""Staging a large bundle's entries in processes: what lets an import reach the disk's speed.

Staging is per-file Python work (open, write, read back, a manifest) around hashing and I/O that
release the GIL; in threads it stops scaling at about 4. Measured on the 16-core H100 machine
(2026-11-24, 2000 entries of 512 KB): one process staged the bundle in 3.4-3.7 s, eight processes
each staging an eighth of it in 0.85 s (1.06 s with their start), GNU tar with a sync in 1.9-2.0 s.

The importing process parses the archive's headers (kcache.bundle.reader, one thread) and
sends each entry, as soon as its last header is read, to one of N stager processes (`python -m
kcache.bundle.stager`) as a JSON line: its key, arch, and each file's offset, size and
sha256 from the signed bundle manifest. A stager reads the bytes with pread from the importer's own
descriptor of the bundle, inherited (`pass_fds`): the file the importer opened once and checked
(kcache.bundle.reader), never the path again, so nothing swapped in at the path since is read.
It verifies what it reads against the signed digests and stages the entry exactly as a thread would
(kcache.bundle.entries.EntryImport), releases it from its own batch, and answers with the
staging directory's name; the importer adopts it into its batch (`PublishBatch.adopt`), which
publishes or discards everything together. A stager that fails removes what it did not hand
over and reports the error; the importer then stops the others (SIGTERM: they remove theirs too)
and discards every adopted entry. A stager killed outright leaves at most its current entry's
staging directory, which gc removes.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Any

from kcache.bundle.entries import BundleError, EntryFate, EntryImport, read_exactly
from kcache.compile.interpreter import internal_environment, python_command
from kcache.store.components import COMPONENTS, KERNELS
from kcache.store.entries import EntryStore
from kcache.store.publish_batch import publish_batch

# A bundle of at least this many entries and bytes is staged in processes: below it, starting them
# (about 0.1-0.2 s) costs more than the threads lose.
PROCESS_STAGING_MIN_ENTRIES = 64
PROCESS_STAGING_MIN_BYTES = 64 << 20
MAX_STAGER_PROCESSES = 8
# A stopped stager removes its staging and exits at once; one that does not within this is killed.
ABORT_WAIT_S = 10.0


def stager_count(entries: int, total_bytes: int) -> int:
    """How many stager processes for a bundle of this size: 0 means stage in threads."""
    if entries < PROCESS_STAGING_MIN_ENTRIES or total_bytes < PROCESS_STAGING_MIN_BYTES:
        return 0
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(MAX_STAGER_PROCESSES, usable, entries // 8))


class ProcessStaging:
    """The importer's side: N stager processes, entries dealt round-robin, answers adopted."""

    def __init__(self, job: EntryImport, count: int, bundle_fd: int) -> None:
        """`count` stagers, each handed `bundle_fd` (the importer's checked descriptor of the bundle)."""
        self._job = job
        self._bundle_fd = bundle_fd
        self._lock = threading.Lock()
        self.fates: dict[str, EntryFate] = {}
        self._errors: list[str] = []
        self._stagers: list[tuple[subprocess.Popen[bytes], IO[bytes], threading.Thread]] = []
        self._next = 0
        header = json.dumps({"bundle": str(job.path), "bundle_fd": bundle_fd, "root": str(job.store.root),
                             "archs": sorted(job.allowed_archs) if job.allowed_archs is not None else None})
        try:
            for _ in range(count):
                self._start(header)
        except OSError as err:  # no process could be started (a limit, a broken interpreter)
            self.abort()
            raise BundleError(str(job.path), f"cannot start a staging process: {err}") from err

    def _start(self, header: str) -> None:
        stderr = tempfile.TemporaryFile()  # a pipe nobody reads until the end could fill and block it
        process = subprocess.Popen(python_command("from kcache.bundle.stager import main; sys.exit(main())"),
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                   pass_fds=(self._bundle_fd,), env=internal_environment({}))
        assert process.stdin is not None
        answers = threading.Thread(target=self._collect, args=(process,), daemon=True, name="kcache-import-answers")
        answers.start()
        self._stagers.append((process, stderr, answers))
        process.stdin.write(header.encode() + b"\n")

    def submit(self, key: str, entry: dict[str, Any], offsets: dict[str, tuple[int, int]]) -> None:
        """Send `key` (its files at these offsets and sizes in the bundle) to the next stager. A stager
        that failed already stops the import here, with its error."""
        self._raise_first_error()
        process = self._stagers[self._next % len(self._stagers)][0]
        self._next += 1
        line = json.dumps({"key": key, "arch": entry["arch"],
                           "files": {name: [*offsets[name], *entry["files"][name]] for name in entry["files"]}})
        assert process.stdin is not None
        try:
            process.stdin.write(line.encode() + b"\n")
        except BrokenPipeError:  # it died: its answer (or its exit status) says why, in finish()
            pass

    def finish(self) -> dict[str, EntryFate]:
        """Wait for every stager to stage what it was sent; each entry's fate. Raises the first
        error a stager reported (or its death), once all have stopped."""
        for process, _stderr, _answers in self._stagers:
            assert process.stdin is not None
            try:
                process.stdin.close()
            except BrokenPipeError:
                pass
        self._wait()
        self._raise_first_error()
        return self.fates

    def abort(self) -> None:
        """Stop every stager (each removes the staging it did not hand over) and wait for them, also
        when a wait of finish() was itself cut short (an interrupt): none outlives the import."""
        for process, _stderr, _answers in self._stagers:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process, _stderr, _answers in self._stagers:
            try:
                process.wait(ABORT_WAIT_S)
            except subprocess.TimeoutExpired:
                process.kill()  # what it staged stays in .staging, for gc
        self._wait()

    def _wait(self) -> None:
        """Wait for every stager and its answers; the first one that failed names the error. Again
        after an interrupted wait: each step is done once."""
        for process, stderr, answers in self._stagers:
            process.wait()
            answers.join()
            if stderr.closed:
                continue
            if process.returncode != 0:
                stderr.seek(0)
                tail = stderr.read()[-2000:].decode(errors="replace").strip()
                with self._lock:
                    if not self._errors:
                        self._errors.append(f"a staging process exited with status {process.returncode}"
                                            + (f": {tail.splitlines()[-1]}" if tail else ""))
            stderr.close()

    def _collect(self, process: subprocess.Popen[bytes]) -> None:
        """A stager's answers, one JSON line per entry (or one error), adopted as they come."""
        assert process.stdout is not None
        for raw in process.stdout:
            try:
                answer = json.loads(raw)
                if "error" in answer:
                    raise BundleError(str(self._job.path), str(answer["error"]))
                fate = EntryFate(answer["fate"])
                if fate is EntryFate.STAGED:
                    self._job.batch.adopt(answer["key"], answer["name"])
            except (BundleError, ValueError, KeyError, TypeError, RuntimeError) as err:
                with self._lock:
                    self._errors.append(err.reason if isinstance(err, BundleError) else f"a bad answer: {err}")
                continue
            with self._lock:
                self.fates[answer["key"]] = fate

    def _raise_first_error(self) -> None:
        with self._lock:
            first = self._errors[0] if self._errors else None
        if first is not None:
            raise BundleError(str(self._job.path), first)


# ---------------------------------------------------------------- the stager process


def main() -> int:
    """Stage the entries sent on stdin (a header line, then one line per entry); answer each on stdout."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # unwinds: the batch removes what it holds
    # A Ctrl-C reaches the whole process group: the importer decides, and stops its stagers (SIGTERM).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out = sys.stdout
    try:
        header = json.loads(sys.stdin.readline())
        path = Path(header["bundle"])  # for messages only: the bundle is read from its descriptor
        fd = int(header["bundle_fd"])
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # the importer's was one: this descriptor is not it
            raise BundleError(str(path), f"descriptor {fd} is not the bundle the importer opened")
        store = EntryStore(Path(header["root"]), KERNELS, COMPONENTS, bind_key=True)
        archs = set(header["archs"]) if header["archs"] is not None else None
        with publish_batch(store) as batch:
            job = EntryImport(store, batch, archs, path)
            for line in sys.stdin:
                request = json.loads(line)
                key = request["key"]
                entry = {"arch": request["arch"], "files": {name: spec[2:] for name, spec in request["files"].items()}}
                files = {name: read_exactly(fd, offset, size, path, f"{KERNELS}/{key}/{name}")
                         for name, (offset, size, *_signed) in request["files"].items()}
                fate = job.verify_and_stage(key, entry, files)
                name = batch.release(key) if fate is EntryFate.STAGED else None
                out.write(json.dumps({"key": key, "fate": fate.value, "name": name}) + "\n")
                out.flush()
    except Exception as err:  # every failure is an answer: the importer names it and stops
        reason = err.reason if isinstance(err, BundleError) else f"{type(err).__name__}: {err}"
        out.write(json.dumps({"error": reason}) + "\n")
        out.flush()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
