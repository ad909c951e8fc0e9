"""`autotuner.tune`: compile every config through kcache, benchmark on the GPU, keep the fastest
correct one, and save it so that the next tune compiles nothing (`@autotuner.autotune`, its
decorator form, is autotuner.decorator)."""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import kcache
from autotuner import trials as t
from autotuner.benchmark import Profiler, benchmark, cuda_event_profiler, inputs_for
from autotuner.identity import tune_identity
from autotuner.progress import progress
from kcache.errors import KCacheError
from kcache.results.autotune import COMPONENTS, NAMESPACE, RESULT_FORMAT, AutotuneResult, ConfigOutcome, result_path
from kcache.results.device import current_device_identity, normalized
from kcache.results.tune_once import RemoteResults, TuneOnce, report_to_log
from kcache.store import layout
from kcache.store.entries import EntryStore

log = logging.getLogger("kcache")


class TuneFailed(KCacheError, RuntimeError):
    """No config of a tune worked; `table` says why each one failed."""

    def __init__(self, name: str, table: str) -> None:
        self.name = name
        self.table = table
        self._init_args = (name, table)
        super().__init__(f"no config of the tune of {name} worked:\n{table}")


def tune(
    kernel_factory: Callable[..., Any],
    configs: Sequence[dict[str, Any]],
    *,
    inputs: Sequence[Any] | None = None,
    supply_prog: Callable[[Sequence[Any]], Sequence[Any]] | None = None,
    ref_prog: Callable[..., Any] | None = None,
    target: Any = None,
    out_idx: Any = None,
    warmup: int = 25,
    rep: int = 100,
    compile_workers: int | None = None,
    timeout_s: float | None = None,
    cache: kcache.KernelCache | None = None,
    tune_key: Any = None,
    rtol: float = 1e-2,
    atol: float = 1e-2,
    profiler: Profiler | None = None,
    device: Mapping[str, Any] | None = None,
    force: bool = False,
    verbose: bool = True,
) -> AutotuneResult:
    """Tune `kernel_factory(**config)` over `configs`; the saved result of an identical tune if there is one.

    `inputs`: the kernel's input tensors (default: `supply_prog(kernel.params)`, else random tensors
    of the params' shapes). `ref_prog(*inputs)`: the expected output; configs that differ are
    `wrong_result`. `tune_key`: anything JSON that tells tunes of one factory apart (shapes, say).
    `profiler(kernel, inputs) -> ms`: how a config is timed (default: CUDA events, median of `rep`).
    `device`: the identity of the device the configs are timed on (default: the current CUDA
    device's, kcache.results.device); results of one device model never load on another.

    Tunes once per job: of all processes (and, with KCACHE_REMOTE, nodes) that tune the same
    identity at once, one tunes and the others wait for its result (at most KCACHE_TUNE_WAIT), so
    every one of them gets the same config. A saved result is never replaced by another pick, except
    by `force=True`, which tunes again and replaces it.
    """
    if not configs:
        raise ValueError("tune needs at least one config")
    base = cache if cache is not None else kcache.default_cache()
    if target is None or target == "auto":
        # As TileLang resolves it here (TILELANG_DEFAULT_TARGET, the enclosing Target scope): the
        # compile threads do not see this thread's scope, and the tune's identity must not either.
        from kcache.tilelang.target import requested_target

        target = requested_target(target)
    name = f"{getattr(kernel_factory, '__module__', '?')}.{getattr(kernel_factory, '__qualname__', repr(kernel_factory))}"
    measured_on = normalized(device) if device is not None else current_device_identity()
    identity = tune_identity(kernel_factory, configs, target, out_idx, tune_key, measured_on)
    key = identity[:40]
    path = result_path(base.root, key)

    def saved_result() -> AutotuneResult | None:
        for root in base.read_roots:  # this cache's root, then a shared root it only reads
            saved = _load_bound(result_path(root, key), identity, measured_on)
            if saved is not None:
                log.info("kcache: tune of %s loaded from %s", name, result_path(root, key))
                return saved
        return None

    if not force:
        saved = saved_result()
        if saved is not None:
            return saved
    if profiler is None:
        _require_cuda_device(name)  # before anything compiles, not after every config did
    if base.readonly:  # nothing to claim or save: this process tunes for itself
        return _tune_now(kernel_factory, configs, name, identity, measured_on, base, None, inputs=inputs,
                         supply_prog=supply_prog, ref_prog=ref_prog, target=target, out_idx=out_idx, warmup=warmup,
                         rep=rep, compile_workers=compile_workers, timeout_s=timeout_s, rtol=rtol, atol=atol,
                         profiler=profiler, verbose=verbose)
    once = _claim(base, identity, key, name, saved_result, force, verbose)
    found = once.claim()
    if found is not None:
        return found
    try:
        result = _tune_now(kernel_factory, configs, name, identity, measured_on, base, once, inputs=inputs,
                           supply_prog=supply_prog, ref_prog=ref_prog, target=target, out_idx=out_idx,
                           warmup=warmup, rep=rep, compile_workers=compile_workers, timeout_s=timeout_s,
                           rtol=rtol, atol=atol, profiler=profiler, verbose=verbose)
        if not result.save_to_disk(path, replace=force):
            # A result was saved meanwhile without the claim (a root whose lock could not be taken):
            # the saved pick stands, so that every process of the job runs the same config.
            kept = saved_result()
            if kept is not None:
                if kept.config != result.config:
                    log.warning("kcache: the tune of %s picked %s, but %s was saved first; using the saved "
                                "one (tune again with force=True to replace it)", name, result.config, kept.config)
                return kept
        once.upload()
        if base.settings.remote_url and result.kernel_key:
            base.share(result.kernel_key)  # the best kernel travels with its result (it may predate the remote)
        return result
    finally:
        once.release()


def _claim(base: kcache.KernelCache, identity: str, key: str, name: str,
           saved_result: Callable[[], AutotuneResult | None], force: bool, verbose: bool) -> TuneOnce[AutotuneResult]:
    """The claim on this tune: the root's lock, and the remote lease with KCACHE_REMOTE."""
    store = EntryStore(base.root / NAMESPACE, "", COMPONENTS, check_name=layout.check_entry_name)
    tier = base.remote_tier_for(f"a{RESULT_FORMAT}", store.required) if base.settings.remote_url else None
    remote = RemoteResults(tier, store, key) if tier is not None else None
    path = result_path(base.root, key)

    def report(message: str, first: bool) -> None:
        report_to_log(message, first)
        if verbose and not first:  # the first is a warning, shown by the log already
            print(message, file=sys.stderr)

    return TuneOnce(base.root, identity, name, load=(lambda: None) if force else saved_result,
                    exists=(lambda: False) if force else path.is_dir, wait_s=base.settings.tune_wait_s,
                    remote=remote, lease_s=base.settings.remote_lease_s, report=report, fetch_remote=not force)


def _tune_now(kernel_factory: Callable[..., Any], configs: Sequence[dict[str, Any]], name: str, identity: str,
              measured_on: dict[str, Any], base: kcache.KernelCache, once: TuneOnce[AutotuneResult] | None, *,
              inputs: Any, supply_prog: Any, ref_prog: Any, target: Any, out_idx: Any, warmup: int, rep: int,
              compile_workers: int | None, timeout_s: float | None, rtol: float, atol: float,
              profiler: Profiler | None, verbose: bool) -> AutotuneResult:
    """Compile every config, benchmark the ones that compiled, keep the fastest correct one."""

    def progressed(phase: str, total: int) -> Callable[[int], None]:
        return lambda done: once.progress(phase, done, total) if once is not None else None

    tuning = _tuning_cache(base, compile_workers, timeout_s)
    # In server mode: the service's workers for this tune start (forked) while the configs are built.
    tuning.warm_compiles(len(configs))
    started = time.perf_counter()
    with progress(len(configs), f"compiling {name}", verbose, progressed("compiling", len(configs))) as bar:
        compiled = t.compile_configs(kernel_factory, configs, target=target, cache=tuning, tune_identity=identity,
                                     out_idx=out_idx, progress=lambda _trial: bar.update(1))
    compiled_at = time.perf_counter()
    measure = profiler or cuda_event_profiler(warmup, rep)
    negative = t.NegativeEntries(base.root, identity, writable=not base.readonly)
    latencies: dict[int, float] = {}
    ref_latency = None
    runnable = sum(c.status == t.OK for c in compiled)
    with progress(runnable, f"benchmarking {name}", verbose, progressed("benchmarking", runnable)) as bar:
        for index, trial in enumerate(compiled):
            if trial.status != t.OK:
                continue
            latency = benchmark(trial, inputs, supply_prog, ref_prog, measure, rtol, atol, negative)
            if latency is not None:
                latencies[index] = latency
                if ref_prog is not None and ref_latency is None:
                    ref_latency = measure(ref_prog, inputs_for(trial.kernel, inputs, supply_prog))
            bar.update(1)
    table = t.summary_table(compiled, latencies)
    if verbose:
        print(table, file=sys.stderr)
    if not latencies:
        raise TuneFailed(name, table)
    best = min(latencies, key=lambda index: latencies[index])
    winner = compiled[best]
    libpath = Path(getattr(getattr(winner.kernel, "adapter", None), "libpath", "") or "")
    return AutotuneResult(
        config=winner.config,
        latency=latencies[best],
        ref_latency=ref_latency,
        configs=[ConfigOutcome(c.config, c.status, latencies.get(i), c.message) for i, c in enumerate(compiled)],
        kernel_key=libpath.parent.name if libpath.parent.name else None,
        out_idx=None if out_idx is None else list(out_idx) if isinstance(out_idx, (list, tuple)) else [out_idx],
        target=target if isinstance(target, (dict, str)) or target is None else str(target),
        func=winner.func,
        metadata={"device": measured_on, "tune_identity": identity,
                  "toolchain": getattr(tuning, "_toolchain", None), "tuned": time.time(), "factory": name,
                  "seconds": {"compile": compiled_at - started, "benchmark": time.perf_counter() - compiled_at}},
    )


def _load_bound(path: Path, identity: str, device: dict[str, Any]) -> AutotuneResult | None:
    """The result at `path` if it is this tune's: measured on `device`, and saved for this identity
    (a result copied under another tune's name is another tune's, and is refused)."""
    saved = AutotuneResult.load_from_disk(path, device=device)
    if saved is not None and saved.metadata.get("tune_identity") != identity:
        log.warning("kcache: ignoring the autotune result %s: it was saved for another tune (%s). Tune again "
                    "to replace it.", path, str(saved.metadata.get("tune_identity"))[:16])
        return None
    return saved


class NoBenchmarkDevice(RuntimeError):
    """`tune` times configs on a CUDA GPU by default, and none is visible."""


def _require_cuda_device(name: str) -> None:
    import torch

    if not torch.cuda.is_available():
        raise NoBenchmarkDevice(
            f"autotuner.tune times configs on a CUDA GPU and none is visible here (torch.cuda.is_available() is "
            f"False), so nothing of {name} was compiled. Tune on a GPU machine (a saved result then loads "
            "anywhere), or pass profiler=(kernel, inputs) -> milliseconds to time configs another way.")


def _tuning_cache(base: kcache.KernelCache, workers: int | None, timeout_s: float | None) -> kcache.KernelCache:
    if workers is None and timeout_s is None:
        return base
    settings = dataclasses.replace(base.settings, compile_workers=workers or base.settings.compile_workers,
                                   compile_timeout_s=timeout_s or base.settings.compile_timeout_s)
    return kcache.KernelCache(base.root, settings=settings)
