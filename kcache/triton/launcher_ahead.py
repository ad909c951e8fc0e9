"""Triton's launcher for a tune's kernel, built during the tune's compile-ahead (kcache.triton.parallel_tune)
rather than at its first benchmark's load, where it would follow every compile.

Triton builds a kernel's launcher (a C extension, with the C compiler in the program's process: 0.3 s
on the H200) when a compiled kernel first loads, through its driver's `launcher_cls(src, metadata)`,
and keeps the module in the cache under the hash of its C source. Two ways to build it ahead, both
through that same call, so the module is Triton's own:

- **From the source, as the tune starts** (`from_source`): Triton's CUDA launcher's C source is made
  from the kernel's signature and constants, and of its metadata only the tensor descriptors' layout
  (`tensordesc_meta`), which exists once the kernel is compiled. A tune whose kernel takes no tensor
  descriptor needs nothing of the compile: its launcher is built from the `ASTSource` of the compile
  that started the tune, in a thread of its own, beside the configs' front halves. The metadata it is
  given answers `tensordesc_meta` (None: none) and nothing else: a launcher that reads any other field
  before building (another backend's, another Triton's) stops there, having built nothing, and the
  kernel's first load builds it as Triton does. What is built is found only by a load whose C source
  is the same text: a launcher built from a source that turns out other than the load's is never used.
- **After the first config compiles** (`LauncherAhead`), for a kernel that takes tensor descriptors:
  the first compile to return a kernel builds it in its pool thread, with the kernel's own metadata,
  while the other configs' back halves still run.

The tune's configs share one launcher unless their kernels take tensor descriptors laid out per config;
a launcher of another config's is built at its first load, as Triton does. Triton 3.9 launches every
kernel through its driver's one module: its launcher builds nothing, and reads the compiled kernel's
fields at once (the build from the source then stops there, at no cost).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

log = logging.getLogger("kcache")

# The longest wait, at the end of a tune's compile-ahead, for its launcher's build from the source
# (the C compiler's run): past it the tune goes on, and its first load builds or finds the launcher.
SOURCE_BUILD_WAIT_S = 120.0
THREAD_NAME = "kcache-triton-launcher"


class SourceOnly:
    """A kernel's metadata as far as its launcher's C source reads it before the kernel compiled: no
    tensor descriptors. Any other field is unknown here (AttributeError)."""

    tensordesc_meta = None


def takes_tensor_descriptors(src: Any) -> bool:
    """Whether the kernel's signature has a tensor descriptor (a type `tensordesc<...>`, tuples included):
    then its launcher's source depends on how each was lowered, known only once it compiled."""
    signature = getattr(src, "signature", None)
    types = signature.values() if isinstance(signature, dict) else [signature]
    return "tensordesc" in repr(list(types))


def from_source(src: Any) -> threading.Thread | None:
    """The build of the launcher of `src`'s kernel, started in a thread of its own; None where its
    source needs the compiled kernel (tensor descriptors) or `src` is no kernel's source."""
    if src is None or not hasattr(src, "signature") or takes_tensor_descriptors(src):
        return None
    thread = threading.Thread(target=_build_from_source, args=(src,), name=THREAD_NAME, daemon=True)
    thread.start()
    return thread


def _build_from_source(src: Any) -> None:
    name = getattr(getattr(src, "fn", None), "__name__", src)
    try:
        from triton.runtime import driver

        driver.active.launcher_cls(src, SourceOnly())
    except AttributeError as err:  # the launcher read a field of the compiled kernel's: after its build, or before
        log.debug("kcache: Triton's launcher for %s, from its source ahead, read %s", name, err)
    except Exception as err:  # noqa: BLE001 - the first load builds it again, and meets the error
        log.debug("kcache: building Triton's launcher for %s from its source ahead failed (%s: %s); its first "
                  "load builds it", name, type(err).__name__, err)
    else:
        log.debug("kcache: built Triton's launcher for %s ahead, from its source", name)


class LauncherAhead(Executor):
    """A compile pool as Triton's `AsyncCompileMode` uses it (`submit`), whose first compile to return
    a kernel then calls `build(kernel)` in its thread, once."""

    def __init__(self, pool: Executor, build: Callable[[Any], None]) -> None:
        self._pool, self._build = pool, build
        self._unclaimed = threading.Lock()  # taken, never released, by the compile that builds

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        return self._pool.submit(self._compile, fn, args, kwargs)

    def _compile(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        kernel = fn(*args, **kwargs)
        if self._unclaimed.acquire(blocking=False):
            self._build(kernel)
        return kernel


def build_launcher(kernel: Any) -> None:
    """Triton's launcher for `kernel`, built (or found) through this process's cache manager, as its
    first load would: Triton's own `launcher_cls`, on the kernel's source and metadata."""
    try:
        from triton.runtime import driver

        driver.active.launcher_cls(kernel.src, kernel.metadata)
        log.debug("kcache: built Triton's launcher for %s ahead", getattr(kernel, "name", kernel))
    except Exception as err:  # noqa: BLE001 - the kernel's first load builds it again, and meets the error
        log.debug("kcache: building Triton's launcher ahead failed (%s: %s); its first load builds it",
                  type(err).__name__, err)
