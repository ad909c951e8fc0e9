"""What kcache adds to a fresh process's first Triton hit, timed inside the process: a diagnostic
beside `python -m stress.bench --only triton` (whose p50s spread over tens of milliseconds), not a goal.

    python -m stress.bench --only triton --profile [--repeats 5] [--kernel matmul] [--against DIR]

(`--tunes`: the tunes-at-once profile instead, stress.bench.profiles.tunes.)

One fresh process compiles the kernel into an empty root (the miss); then each of `--repeats` fresh
processes imports Triton, then `kcache.triton.manager` (timed), and compiles the kernel again with
its managers' construction and `get_group` calls timed. Prints the medians in milliseconds.

`--against DIR`: DIR holds another version's `kcache` and `stress` (a checkout of an earlier commit,
say): its processes and this tree's take turns on the same root, and the median of the turns'
differences in the three steps' sum is printed too.

Triton's own `FileCacheManager` takes turns as well, on a cache directory of its own (its module is
loaded with Triton, so only its construction and `get_group` are timed): what kcache adds to the hit is
the difference of the sums, printed last as the median of the turns' differences.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def child(kernel: str) -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    # The kernels of this tree's program, by path, which imports nothing of the project's: another
    # version's tree (--against) may keep its programs elsewhere, or not have this one.
    kernels = runpy.run_path(str(Path(__file__).resolve().parents[2] / "programs" / "triton_programs" / "compile.py"))
    started = time.perf_counter()
    if os.environ.get("TRITON_CACHE_MANAGER"):
        import kcache.triton.manager as manager

        manager_class: Any = manager.CacheManager
    else:  # Triton's own, loaded with Triton
        from triton.runtime.cache import FileCacheManager as manager_class

    timings: dict[str, Any] = {"import_ms": (time.perf_counter() - started) * 1000, "init_ms": [], "get_group_ms": []}

    def timed(name: str, original: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            begun = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                timings[name].append((time.perf_counter() - begun) * 1000)
        return wrapper

    manager_class.__init__ = timed("init_ms", manager_class.__init__)
    manager_class.get_group = timed("get_group_ms", manager_class.get_group)
    fn, signature, constants = kernels["KERNELS"][kernel]
    begun = time.perf_counter()
    triton.compile(ASTSource(fn, signature, constants), target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    timings["compile_ms"] = (time.perf_counter() - begun) * 1000
    print("result " + json.dumps(timings), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stress.bench.profiles.triton")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--kernel", default="matmul")
    parser.add_argument("--against", type=Path, help="another version's tree (kcache/ and stress/): taking turns")
    parser.add_argument("--tunes", action="store_true",
                        help="instead: where kcache's lane of 8 tunes at once spends its window (GPU)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args(argv)
    if args.tunes:
        from .tunes import main as tunes

        tunes(["--repeats", str(args.repeats), *rest])
        return
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.child:
        child(args.child)
        return
    from ..suite.children import bytecode_as_installed
    from ..suite.timing import take_turns

    trees = {"this tree": Path(__file__).resolve().parents[3]}  # the checkout: stress/bench/profiles/ is three below it
    if args.against is not None:
        trees["--against"] = args.against.resolve()
    # Every tree's kcache from bytecode, as after a pip install (the GPU image sets PYTHONDONTWRITEBYTECODE:
    # a tree without bytecode compiled its modules from source in every process, 15-20 ms of "import").
    bytecode = bytecode_as_installed()  # this tree's, as the bench's
    if args.against is not None:
        compileall.compile_dir(str(trees["--against"] / "kcache"), quiet=1)
    with tempfile.TemporaryDirectory(prefix="kcache-triton-first-") as root:
        env = {**os.environ, **bytecode, "TRITON_CACHE_MANAGER": "kcache.triton:CacheManager",
               "KCACHE_DIR": f"{root}/kcache"}
        own_env = {key: value for key, value in env.items() if key != "TRITON_CACHE_MANAGER"}
        own_env["TRITON_CACHE_DIR"] = f"{root}/triton"
        _hit(trees["this tree"], args.kernel, env)  # the misses
        _hit(trees["this tree"], args.kernel, own_env)
        runs = take_turns([*trees, TRITON_OWN], args.repeats, lambda name, _turn: _hit(
            trees.get(name, trees["this tree"]), args.kernel, own_env if name == TRITON_OWN else env))
    totals = {}
    for name, hits in runs.items():
        print(f"{name} ({trees[name]}):" if name in trees else f"{name}:")
        for what in ("import_ms", "init_ms", "get_group_ms", "compile_ms"):
            values = [_ms(run, what) for run in hits]
            print(f"{what[:-3]:<10} median {statistics.median(values):8.2f} ms  "
                  f"(range {min(values):.2f}-{max(values):.2f}, {len(values)} fresh processes)")
        totals[name] = [sum(_ms(run, what) for what in ("import_ms", "init_ms", "get_group_ms")) for run in hits]
    if len(trees) > 1:
        paired = statistics.median(a - b for a, b in zip(totals["this tree"], totals["--against"]))
        print(f"import + init + get_group, this tree minus --against: median of the turns' differences {paired:+.2f} ms")
    added = statistics.median(a - b for a, b in zip(totals["this tree"], totals[TRITON_OWN]))
    print(f"import + init + get_group, this tree minus {TRITON_OWN}: median of the turns' differences {added:+.2f} ms"
          " (issue 38's goal: at most +1 ms on the hit)")


TRITON_OWN = "Triton's own FileCacheManager"


def _hit(tree: Path, kernel: str, env: dict[str, str]) -> dict[str, Any]:
    """One fresh process of `tree`'s kcache (its directory first on sys.path, as `-m` puts it). The child's
    code is this file's, run by path: an --against tree from before stress/bench/ has no such module."""
    run_child = (f"import runpy, sys; sys.argv = ['triton_profile', '--child', {kernel!r}]; "
                 f"runpy.run_path({__file__!r}, run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", run_child], cwd=str(tree),
                          env={**env, "PYTHONPATH": str(tree)}, capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("result ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"stress.bench.profiles.triton: a process of {tree} failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1][len("result "):])
    return result


def _ms(run: dict[str, Any], what: str) -> float:
    value = run[what]
    return float(sum(value)) if isinstance(value, list) else float(value)


if __name__ == "__main__":
    main()
