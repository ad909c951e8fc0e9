"""`AutotuneResult`: what a tune found, saved and loaded with kcache's publish protocol.

An entry is a directory of:

    best_config.json   the winning config
    latency.json       its latency and the reference's (ms)
    configs.json       every config tried, with its outcome
    kernel.json        the best kernel's cache key, out_idx and target
    function.pkl       the tuned function (cloudpickle)
    meta.json          its name (the key it is stored under), device identity, toolchain, time, host
    manifest.json      sizes and sha256 of all of the above

It is staged beside its final path and published with one rename, only
once every file is written and verified (kcache.store.EntryStore: the same
code as kernel entries). Loading checks trust on every descriptor (the
result's directory and its parent, each file) before it reads a byte,
verifies the manifest before it parses anything, and unpickles only the
bytes it verified, from a directory the current user owns and nobody else
may write: a corrupt, partial or tampered entry is a miss with one warning,
never a crash, a hang or a SIGBUS.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import cloudpickle

from kcache.cache.default import default_cache
from kcache.config import Settings
from kcache.errors import CorruptEntry, KCacheError, UntrustedEntry
from kcache.results.device import NO_CUDA_DEVICE, current_device_identity, describe, normalized
from kcache.store import layout
from kcache.store.entries import EntryStore, PublishOutcome
from kcache.store.fsutil import write_durable
from kcache.store.locks import KeyLock

log = logging.getLogger("kcache")

NAMESPACE = "autotuner"
BEST_CONFIG = "best_config.json"
LATENCY = "latency.json"
CONFIGS = "configs.json"
KERNEL = "kernel.json"
FUNCTION = "function.pkl"
META = "meta.json"
COMPONENTS = frozenset({BEST_CONFIG, LATENCY, CONFIGS, KERNEL, FUNCTION, META})
# 2: meta.json names the result's key and the identity of the device it was measured on.
RESULT_FORMAT = 2
# `load_from_disk(device=CURRENT_DEVICE)`: compare with this process's current CUDA device.
CURRENT_DEVICE = "current"


@dataclass
class ConfigOutcome:
    """One config of a tune: "ok" with its latency, or the class of its failure and the message."""

    config: dict[str, Any]
    status: str
    latency: float | None = None
    message: str = ""


@dataclass
class AutotuneResult:
    """The best config of a tune, every config's outcome, and how to get the best kernel back."""

    config: dict[str, Any] | None
    latency: float | None
    ref_latency: float | None = None
    configs: list[ConfigOutcome] = field(default_factory=list)
    kernel_key: str | None = None
    out_idx: list[int] | None = None
    target: Any = None  # JSON: a target dict or string
    func: Any = None  # the tuned function: the best config's PrimFunc, or a kernel factory
    metadata: dict[str, Any] = field(default_factory=dict)

    def load_kernel(self, cache: Any = None) -> Any:
        """The best config's kernel, through kcache (a disk hit after the tune that found it)."""
        if self.func is None:
            raise KCacheError("this AutotuneResult has no function to build its kernel from")
        chosen = cache if cache is not None else default_cache()
        return chosen.get_or_compile(self.func, self.target, out_idx=self.out_idx)

    # ------------------------------------------------------------ disk

    def save_to_disk(self, path: str | os.PathLike[str], *, replace: bool = False) -> bool:
        """Publish this result as the directory `path`, atomically.

        True if this call published it; False if an intact result was already
        there (another process saved the same tune first), which is kept: a
        saved pick is never silently replaced. `replace=True` (a forced
        re-tune) replaces it. Raises KCacheError for what cannot be saved,
        naming the path.
        """
        path = Path(path)
        store = _store_at(path)
        files = self._serialize(path)

        def fill(staging: Path) -> None:
            for name, data in files.items():
                write_durable(staging / name, data)

        if store.publish(path.name, fill) is PublishOutcome.PUBLISHED:
            return True
        # Something is there already: keep it if it is intact, else replace it under the name's lock.
        lock = KeyLock(store.root / layout.LOCKS / f"{layout.staging_key(path.name)}.lock", path.name)
        lock.acquire(Settings.from_env(store.root).lock_timeout_s)
        with lock:
            try:
                if store.read(path.name) is not None:
                    if not replace:
                        return False
                    store.quarantine(path.name, "replaced by a forced re-tune")
            except CorruptEntry as corrupt:
                store.quarantine(path.name, corrupt.reason)
            return store.publish(path.name, fill) is PublishOutcome.PUBLISHED

    @property
    def device(self) -> dict[str, Any] | None:
        """The identity of the device this result was measured on (kcache.results.device), if recorded."""
        recorded = self.metadata.get("device")
        return recorded if isinstance(recorded, dict) else None

    @classmethod
    def load_from_disk(cls, path: str | os.PathLike[str], *,
                       device: Mapping[str, Any] | str | None = CURRENT_DEVICE) -> AutotuneResult | None:
        """The result saved at `path`, or None: missing, measured on another device model, or (with
        one warning) corrupt, partial, untrusted or unreadable.

        `device`: the device the result must have been measured on. By default this process's
        current CUDA device, when one is visible (with none visible there is nothing to compare,
        and the result loads); a mapping names one (kcache.results.device); None loads it whatever
        it was measured on. A result that records no device loads whatever `device` says."""
        result = cls._load(Path(path))
        if result is None or device is None or result.device is None:
            return result  # a result saved without its device (by code that did not say) loads anywhere
        wanted = current_device_identity() if device == CURRENT_DEVICE else normalized(device)  # type: ignore[arg-type]
        if device == CURRENT_DEVICE and wanted == NO_CUDA_DEVICE:
            return result
        if result.device != wanted:
            log.info("kcache: not loading the autotune result %s: it was measured on %s, and this is %s",
                     path, describe(result.device), describe(wanted))
            return None
        return result

    @classmethod
    def _load(cls, path: Path) -> AutotuneResult | None:
        try:
            # Trust is checked on each descriptor before its bytes are read; only those bytes are
            # unpickled (a swap after the check changes nothing).
            files = _store_at(path).read(path.name)
        except UntrustedEntry as untrusted:
            log.warning("kcache: refusing to unpickle the autotune result %s: %s. Only load results from a "
                        "directory you own that nobody else can write (chmod go-w), or tune again.", path,
                        untrusted.reason)
            return None
        except CorruptEntry as corrupt:
            log.warning("kcache: ignoring the autotune result %s: %s. Tune again to replace it.", path, corrupt.reason)
            return None
        except (OSError, ValueError) as err:
            log.warning("kcache: cannot read the autotune result %s: %s", path, err)
            return None
        if files is None:
            return None
        try:
            return cls._deserialize(files)
        except Exception as err:  # a verified entry that will not parse or unpickle (another version's), whatever raised
            log.warning("kcache: ignoring the autotune result %s: it verified but cannot be read back: %s: %s",
                        path, type(err).__name__, err)
            return None

    def _serialize(self, path: Path) -> dict[str, bytes]:
        try:
            function = cloudpickle.dumps(self.func)
        except Exception as err:  # cloudpickle raises many types for what it cannot pickle
            raise KCacheError(f"cannot save the autotune result {path}: its function does not pickle: {err}") from err
        meta = {
            "format": RESULT_FORMAT,
            "created": time.time(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            **_measured_here(),
            **self.metadata,
            "key": path.name,  # a remote value must name the key it is stored under
        }
        return {
            BEST_CONFIG: _json(self.config),
            LATENCY: _json({"latency": self.latency, "ref_latency": self.ref_latency}),
            CONFIGS: _json([asdict(outcome) for outcome in self.configs]),
            KERNEL: _json({"key": self.kernel_key, "out_idx": self.out_idx, "target": self.target}),
            FUNCTION: function,
            META: _json(meta),
        }

    @classmethod
    def _deserialize(cls, files: dict[str, bytes]) -> AutotuneResult:
        meta = json.loads(files[META])
        if meta.get("format") != RESULT_FORMAT:
            raise ValueError(f"result format {meta.get('format')!r}, this kcache reads {RESULT_FORMAT}")
        latency = json.loads(files[LATENCY])
        kernel = json.loads(files[KERNEL])
        return cls(
            config=json.loads(files[BEST_CONFIG]),
            latency=latency["latency"],
            ref_latency=latency["ref_latency"],
            configs=[ConfigOutcome(**outcome) for outcome in json.loads(files[CONFIGS])],
            kernel_key=kernel["key"],
            out_idx=kernel["out_idx"],
            target=kernel["target"],
            func=_unpickle_function(files[FUNCTION]),
            metadata=meta,
        )


# Modules whose classes are whole only after `import tilelang`: TileLang ships its own TVM (put on
# sys.path by that import) and registers its operators (tl.*) then; a PrimFunc rebuilt before that
# either misses the module or fails on an unregistered operator.
TILELANG_PROVIDED = ("tvm", "tvm_ffi", "tilelang")


def _unpickle_function(data: bytes) -> Any:
    """The result's function, in a process that may not have imported TileLang yet (a server that
    loads its tuned configs first): a pickle that names TileLang's modules gets TileLang imported
    first, or an error that says to install it."""
    if "tilelang" not in sys.modules and any(name.encode() in data for name in TILELANG_PROVIDED):
        try:
            import tilelang  # noqa: F401 - for its side effects: TVM on sys.path, operators registered
        except ImportError as missing:
            raise ModuleNotFoundError(
                f"this autotune result's function is a TileLang PrimFunc and TileLang cannot be imported "
                f"here: {missing}. Install TileLang in this environment.", name="tilelang") from missing
    return cloudpickle.loads(data)


def _measured_here() -> dict[str, Any]:
    """{"device": identity} of this process's current CUDA device, for a result whose metadata does not
    say where it was measured: where torch is loaded, that is the device it ran on. Where torch is
    not loaded nothing was timed with it, and the result records no device."""
    if "torch" not in sys.modules:
        return {}
    identity = current_device_identity()
    return {} if identity == NO_CUDA_DEVICE else {"device": identity}


def result_path(root: str | os.PathLike[str], key: str) -> Path:
    """Where the result of tune `key` lives under a cache root: `<root>/autotuner/<key>`."""
    return Path(root) / NAMESPACE / layout.check_entry_name(key)


def _store_at(path: Path) -> EntryStore:
    # The parent directory is the store: staging in <parent>/.staging, so that the rename stays
    # on one filesystem and the cache's gc (which walks every .staging under a root) cleans it.
    return EntryStore(path.parent, "", COMPONENTS, check_name=layout.check_entry_name)


def _json(value: Any) -> bytes:
    return json.dumps(value, indent=1, sort_keys=True).encode()
