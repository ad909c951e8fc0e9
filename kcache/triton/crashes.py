"""Triton compiles that crashed, remembered: a config whose compile aborted is not compiled again.

An autotuner that meets a crashing config in every process would crash a fork each time (seconds of
compile, and the same LLVM assertion in every log). So a crash is saved as an entry of its own,
keyed like the compile: `entry_key(Triton's key, CRASH_FILE)`. Triton's key holds Triton's version,
the hash of its compiler and of ptxas, the source and the options, so a new toolchain forgets the
crash; so does `kcache clear`. The record is bounded JSON, read through the store (trust, manifest,
sha256) and never executed; a record that fails any check is no record (the compile runs).

Only a compiler's own crash is remembered: the signals a compiler raises itself (SIGABRT from an LLVM
assertion, SIGSEGV, SIGBUS, SIGILL, SIGFPE). A worker killed from outside (SIGKILL from the OOM killer
or an admin, SIGTERM, SIGINT), an exit, or a timeout says nothing of the kernel: a loaded machine
may be what made it slow or killed it. A record stays on this machine's root: it is never uploaded to
the remote tiers (nor read from them), so one node's crash, or its broken toolchain, never stops a
fleet's compiles; each node learns its own. `kcache clear --crashes` forgets every record of a root,
and `kcache ls` lists each with its signal and date.
"""

from __future__ import annotations

import datetime
import json
import logging
from typing import Any

from kcache.errors import CompilerCrashed
from kcache.triton.store import GroupStore, entry_key

log = logging.getLogger("kcache")

CRASH_FILE = "kcache-crash.json"
MAX_RECORD_BYTES = 64 * 1024
_FIELDS = {"kernel": str, "signal": (str, type(None)), "exit_code": (int, type(None)), "tail": str, "created": str}


def remembered(groups: GroupStore) -> dict[str, Any] | None:
    """The crash recorded for this compile's key, or None."""
    found = groups.read(entry_key(groups.triton_key, CRASH_FILE), None, CRASH_FILE)
    if found is None:
        return None
    data = found[1][CRASH_FILE]
    try:
        record = json.loads(data) if len(data) <= MAX_RECORD_BYTES else None
    except ValueError:
        record = None
    if not isinstance(record, dict) or any(not isinstance(record.get(name), kinds) for name, kinds in _FIELDS.items()):
        log.warning("kcache: ignoring the malformed crash record %s of Triton's key %s", CRASH_FILE, groups.key[:16])
        return None
    _log_miss(groups, record["kernel"], f"{record['signal'] or 'exit %s' % record['exit_code']}, remembered from "
              f"{record['created']}")
    return record


# The signals a compiler raises itself: what kills it says something of the kernel.
COMPILER_SIGNALS = frozenset({"SIGABRT", "SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE"})


def raise_remembered(groups: GroupStore, name: str) -> None:
    """Where a compile of this key crashed the compiler before: TritonCompilerCrashed, at once, for the
    compile `name` (kcache.triton.isolation.describe's)."""
    from kcache.triton.errors import TritonCompilerCrashed

    record = remembered(groups)
    if record is not None:
        log.warning("kcache: skipping Triton's compile of %s: its compiler crashed (%s) on %s; "
                    "`kcache clear --crashes` forgets remembered crashes", name,
                    record["signal"] or f"exit {record['exit_code']}", record["created"])
        raise TritonCompilerCrashed(name, record["signal"], record["exit_code"], record["tail"], record["created"])


def how_it_died(crash: CompilerCrashed) -> str:
    """`crashed (SIGABRT)`, `was killed (SIGKILL) from outside`, `exited with status 3`."""
    if crash.signal_name in COMPILER_SIGNALS:
        return f"crashed ({crash.signal_name})"
    if crash.signal_name:
        return f"was killed ({crash.signal_name}) from outside the compiler"
    return f"exited with status {crash.exit_code}"


def remember(groups: GroupStore, crash: CompilerCrashed) -> bool:
    """Save `crash` under this compile's key, where it is a compiler's own crash and the root can be
    written (else nothing); whether it was saved."""
    if crash.signal_name not in COMPILER_SIGNALS:
        return False
    record = {"kernel": crash.kernel_name, "signal": crash.signal_name, "exit_code": crash.exit_code,
              "tail": crash.stderr_tail[-8000:],
              "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    saved = groups.publish(entry_key(groups.triton_key, CRASH_FILE), None,
                           {CRASH_FILE: json.dumps(record, sort_keys=True).encode()}, upload=False)
    _log_miss(groups, crash.kernel_name, crash.signal_name or f"exit {crash.exit_code}")
    return saved is not None


def _log_miss(groups: GroupStore, described: str, how: str) -> None:
    """A crashed compile's lookup in the miss log, so that `kcache why-miss --last` names it: the kernel
    (without the config the autotuner's name adds) and how it crashed; no key fields, since Triton
    compiled no group to read them from."""
    if groups.where.write is None:
        return
    from kcache.cache import miss_explain

    miss_explain.log_miss(groups.where.write, groups.key, described.partition(" [")[0], {}, crashed=how)
