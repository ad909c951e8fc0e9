"""Loaded by every interpreter that the tunes profile starts, kcache's own included (its compile service,
worker template and workers keep the absolute PYTHONPATH entries), where KCACHE_PHASES_LOG is set: the
steps of a Triton compile under kcache, each call's start and end appended to that log as JSON lines
{pid, thread, what, start, end, detail}, on the machine's wall clock. Each step is wrapped as its module is first
imported (a worker forked from the template inherits the wrapped modules). Not a package: a folder the
profile puts on its children's PYTHONPATH (stress.bench.profiles.tunes). Self-contained, not written
through stress.bench.profiles.events: kcache's own interpreters drop relative path entries, and may
not find `stress` there."""

from __future__ import annotations

import functools
import importlib.abc
import json
import os
import sys
import threading
import time
from typing import Any

LOG = os.environ.get("KCACHE_PHASES_LOG")
# module -> (its attribute, the step's name)
STEPS = {
    "kcache.triton.frontend": [("stages_job", "front half")],  # caller
    "kcache.compile.service.client": [("ServicePool.run", "back half asked")],  # caller
    "kcache.compile.pool.job_on_worker": [("run_job", "slot runs job")],  # service
    "kcache.compile.service.scheduler": [("FairScheduler.add", "job queued")],  # service
    "kcache.triton.stages": [("run_stages", "back half")],  # worker
}


def _detail(what: str, args: tuple[Any, ...]) -> str:
    if what == "slot runs job" and args:  # the worker it ran on
        return str(getattr(getattr(args[0], "worker", None), "pid", ""))
    if what == "back half" and args:  # the config's passes
        options = getattr(args[0], "options", None)
        return f"stages={getattr(options, 'num_stages', '')} warps={getattr(options, 'num_warps', '')}"
    return ""


def _log(what: str, start: float, end: float, detail: str) -> None:
    line = json.dumps({"pid": os.getpid(), "thread": threading.current_thread().name, "what": what,
                       "start": start, "end": end, "detail": detail}) + "\n"
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)  # one write: lines never interleave
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _timed(original: Any, what: str) -> Any:
    @functools.wraps(original)  # the same name and module: a job pickled by reference finds the wrapper
    def step(*args: Any, **kwargs: Any) -> Any:
        detail = _detail(what, args)
        start = time.time()
        try:
            return original(*args, **kwargs)
        finally:
            _log(what, start, time.time(), detail)

    return step


class _WrapOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in STEPS:
            return None
        for finder in sys.meta_path:
            spec = None if finder is self else getattr(finder, "find_spec", lambda *a: None)(name, path, target)
            if spec is not None:
                break
        else:
            return None
        execute = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            execute(module)
            for attribute, what in STEPS[name]:
                owner, parts = module, attribute.split(".")
                for part in parts[:-1]:
                    owner = getattr(owner, part)
                setattr(owner, parts[-1], _timed(getattr(owner, parts[-1]), what))

        spec.loader.exec_module = exec_module
        return spec


if LOG:
    sys.meta_path.insert(0, _WrapOnImport())
