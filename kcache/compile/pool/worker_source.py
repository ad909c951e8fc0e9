"""Where a `CompilePool`'s workers come from: forks of one worker template, or fresh interpreters.

With `start="fork"` (the compile service's), workers are forked by a worker template that imported
TileLang once: a worker, and the replacement of a crashed one, then costs a fork (milliseconds)
instead of an interpreter that imports TileLang (seconds). Where the template cannot fork safely
(it would hold threads) or cannot start, workers start by exec, and stay so for the pool's life.

Apart from the pool because the template's life (started early or on first use, checked for
threads, replaced when gone, given up on) is its own state machine under its own lock: the pool
only asks for a worker.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable

from kcache.compile.pool.spare_workers import SpareWorkers
from kcache.compile.workers.template_process import TemplateGone, WorkerTemplate
from kcache.compile.workers.worker_process import WorkerProcess, anonymous_append_file
from kcache.errors import CompilePoolError

log = logging.getLogger("kcache")


class WorkerSource:
    """Starts workers that import `preload`: forked from a worker template where `fork` is set and
    the template is usable, by exec otherwise."""

    def __init__(self, preload: Iterable[str], start_timeout_s: float, *, fork: bool, spares: int = 0) -> None:
        self.preload = tuple(preload)
        self.start_timeout_s = start_timeout_s
        self._template: WorkerTemplate | None = None
        self._template_lock = threading.Lock()
        self._template_unusable = not fork
        # Forked ahead from the template (spare_workers); none for workers started by exec.
        self._spares = SpareWorkers(self._fork_spare, self._is_current, spares) if fork and spares else None

    def start_worker(self) -> WorkerProcess:
        """A fresh worker: a spare forked ahead where one is ready, else one started now."""
        spare = self._spares.take() if self._spares is not None else None
        if spare is not None:
            return spare
        template = self._usable_template()
        if template is not None:
            try:
                return WorkerProcess(self.preload, self.start_timeout_s, template)
            except TemplateGone as err:  # the next start makes a new template
                log.warning("kcache: the compile worker template is gone (%s); starting a new one", err)
        return WorkerProcess(self.preload, self.start_timeout_s)

    def wait_for_spares(self) -> None:
        """Until the spares are ready (`SpareWorkers.wait_ready`), at most the start timeout."""
        if self._spares is not None:
            self._spares.wait_ready(self.start_timeout_s)

    def retire(self, worker: WorkerProcess) -> None:
        """A worker whose one job is done: it exits, and is waited for off the caller's path where
        spares are kept (their thread reaps it), else here."""
        if self._spares is not None:
            self._spares.retire(worker)
        else:
            worker.close()

    def template_pid(self) -> int | None:
        """The worker template's pid, if workers are forked from one now."""
        template = self._template
        return template.pid if template is not None and template.alive else None

    def start_template(self, *, forked: bool = False) -> None:
        """Start the worker template now, without waiting for its imports; the first worker start
        waits for them. `forked`: fork this process into it (only while it holds one thread: the
        compile service does this first thing)."""
        with self._template_lock:
            if not self._template_unusable and self._template is None:
                self._template = self._new_template(forked)

    def close(self) -> None:
        """Stop the spares and the template; every later worker starts by exec."""
        if self._spares is not None:
            self._spares.close()
        with self._template_lock:
            if self._template is not None:
                self._template.close()
                self._template = None
            self._template_unusable = True

    def _fork_spare(self) -> WorkerProcess:
        template = self._usable_template()
        if template is None:
            raise CompilePoolError("no worker template: workers start by exec", "")
        return WorkerProcess(self.preload, self.start_timeout_s, template)

    def _is_current(self, worker: WorkerProcess) -> bool:
        """Whether `worker` was forked by the template that forks now, which still runs."""
        template = self._template
        return template is not None and worker.template is template and template.alive

    def _new_template(self, forked: bool = False) -> WorkerTemplate | None:
        stderr = anonymous_append_file()
        try:
            return WorkerTemplate(self.preload, self.start_timeout_s, stderr, forked=forked)
        except (TemplateGone, CompilePoolError, OSError) as err:
            self._template_unusable = True
            log.warning("kcache: the compile worker template could not start (%s); workers start by exec", err)
            return None
        finally:
            os.close(stderr)  # the template holds its own copy

    def _usable_template(self) -> WorkerTemplate | None:
        """The worker template, started on first use unless `start_template` did (the first worker
        waits for its imports, the others fork from it); None where workers start by exec."""
        with self._template_lock:
            if self._template_unusable:
                return None
            if self._template is not None and not self._template.alive:
                self._template.close()
                self._template = None
            template = self._template or self._new_template()
            if template is None:
                return None
            try:
                template.wait_ready()
            except TemplateGone as err:
                self._template = None
                self._template_unusable = True
                log.warning("kcache: the compile worker template could not start (%s); workers start by exec", err)
                return None
            threads = template.threads or []
            if len(threads) > 1:
                # A fork would copy a process whose other threads may hold locks: not safe.
                self._template = None
                self._template_unusable = True
                log.warning("kcache: the compile worker template holds %d threads after importing %s (%s); "
                            "workers start by exec", len(threads), ", ".join(self.preload) or "nothing",
                            ", ".join(threads[1:]))
                template.close()
                return None
            self._template = template
            return template
