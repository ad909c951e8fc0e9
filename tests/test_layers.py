"""The floor plan: imports go one way, down the layers of docs/design.md, with no circles.

The import graph is read from the code (ast), every import counted: at module level, inside
functions (lazy imports are still dependencies) and under TYPE_CHECKING.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parent.parent
PACKAGES = ("kcache", "autotuner", "stress")

# Bottom to top. A module may import the modules of lower layers, and modules of its own
# subpackage (acyclically); never a sibling subpackage of its layer, never a higher layer.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("kcache.errors", "kcache.keys", "kcache.import_hooks", "kcache.lookup_log", "kcache.interruption",
              "kcache.redaction")),
    ("store", ("kcache.store",)),
    ("setting values", ("kcache.setting_values",)),
    ("settings", ("kcache.config",)),
    ("services", ("kcache.maintenance", "kcache.compile")),
    ("tiers and backend", ("kcache.tiers", "kcache.tilelang")),
    ("cache", ("kcache.cache",)),
    ("results", ("kcache.results",)),
    ("triton", ("kcache.triton",)),
    ("helion", ("kcache.helion",)),
    ("drop-in", ("kcache.dropin",)),
    ("bundles", ("kcache.bundle",)),
    ("command line", ("kcache.cli",)),
    ("facade", ("kcache", "kcache.__main__")),
    ("autotuner", ("autotuner",)),
    ("stress harness", ("stress",)),
    ("benchmarks", ("stress.bench",)),  # the suite uses the harness; the harness knows no benchmark
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PROJECT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((PROJECT / package).rglob("*.py")):
            found[module_name(path)] = path
    return found


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `name` imports: `from a.b import c` names a.b.c where that is a module."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import kcache.store.layout` names that module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def layer_of(module: str) -> tuple[int, str]:
    """(rank, the layer's package the module belongs to), the longest matching package. The facade
    is `kcache` itself: a new module directly under kcache/ belongs to no layer until it is placed."""
    best = (-1, "", "")
    for rank, (_, packages) in enumerate(LAYERS):
        for package in packages:
            inside = module == package or (module.startswith(package + ".") and package != "kcache")
            if inside and len(package) > len(best[2]):
                best = (rank, package, package)
    assert best[0] >= 0, f"{module} is in no layer: add it to LAYERS and to the map in docs/design.md"
    return best[0], best[1]


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for succ in sorted(graph.get(node, ())):
            if state.get(succ) == 1:
                return path[path.index(succ):] + [succ]
            if succ not in state:
                cycle = visit(succ)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_checker_sees_cycles_and_lazy_imports(tmp_path: Path) -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    modules = {"kcache": Path(), "kcache.store": Path(), "kcache.store.layout": Path(), "kcache.cache": Path()}
    source = tmp_path / "mod.py"
    source.write_text("def f():\n    from kcache.store import layout\n    import kcache.cache\n")
    assert imports_of("kcache.x", source, modules) == {"kcache.store.layout", "kcache.cache"}
    assert layer_of("kcache.store.layout") == (1, "kcache.store")
    assert layer_of("kcache") == (13, "kcache")


def test_no_import_circles_among_modules_nor_between_packages() -> None:
    graph = import_graph()
    assert find_cycle(graph) is None, f"import circle: {' -> '.join(find_cycle(graph) or [])}"
    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        packages.setdefault(module.split(".")[0], set()).update(t.split(".")[0] for t in targets)
    for package in packages:
        packages[package].discard(package)
    assert "autotuner" not in packages["kcache"], "kcache imports autotuner: autotuner depends on kcache, never back"
    assert find_cycle(packages) is None


def test_every_import_goes_down_the_layers() -> None:
    wrong = []
    for module, targets in import_graph().items():
        rank, package = layer_of(module)
        for target in sorted(targets):
            target_rank, target_package = layer_of(target)
            if target_rank > rank or (target_rank == rank and target_package != package):
                wrong.append(f"{module} ({LAYERS[rank][0]}) imports {target} ({LAYERS[target_rank][0]})")
    assert not wrong, "imports against the layer direction:\n" + "\n".join(wrong)


# The compile layer's lanes (docs/design/compile.md, "What crosses a process"): each lane's folder imports the
# shared modules of kcache.compile and itself; the service imports its fallbacks' lanes; the shared
# modules import no lane.
COMPILE_LANES = {"kcache.compile.fork": (), "kcache.compile.pool": (),
                 "kcache.compile.service": ("kcache.compile.fork", "kcache.compile.pool")}


def lane_of(module: str) -> str | None:
    return next((lane for lane in COMPILE_LANES if module == lane or module.startswith(lane + ".")), None)


def test_the_compile_lanes_import_only_the_shared_modules_and_their_fallbacks() -> None:
    graph = import_graph()
    assert {lane_of(module) for module in graph if module.startswith("kcache.compile.")} == {None, *COMPILE_LANES}
    wrong = [f"{module} imports {target}" for module, targets in graph.items() if module.startswith("kcache.compile")
             for target in sorted(targets)
             if lane_of(target) not in (None, lane_of(module), *COMPILE_LANES.get(lane_of(module) or "", ()))]
    assert not wrong, "imports across the compile lanes:\n" + "\n".join(wrong)


def loaded_after(statement: str) -> set[str]:
    """The project modules a fresh interpreter has loaded after `statement`."""
    code = f"{statement}\nimport json, sys\nprint(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {PACKAGES!r})))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")]))}
    env.pop("KCACHE_TILELANG", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=PROJECT, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("package", [package for _, packages in LAYERS for package in packages
                                     if package.startswith("kcache.") and package != "kcache.__main__"])
def test_importing_a_layer_loads_only_it_and_the_layers_below(package: str) -> None:
    rank, _ = layer_of(package)
    loaded = loaded_after(f"import {package}")
    above = sorted(m for m in loaded if m != "kcache" and layer_of(m)[0] > rank)
    assert not above, f"import {package} loaded modules of higher layers: {above}"
    assert "autotuner" not in {m.split(".")[0] for m in loaded}


def test_import_kcache_loads_the_facade_its_errors_and_import_hooks_only() -> None:
    # Every public name loads on first use: `import kcache` is cheap wherever it happens.
    errors = {"kcache.errors", "kcache.errors.base", "kcache.errors.compiling", "kcache.errors.storage"}
    assert loaded_after("import kcache") == {"kcache", "kcache.import_hooks", *errors}
    assert "kcache.cache.kernel_cache" in loaded_after("import kcache; kcache.KernelCache")


# The miss path: loaded by the first miss, never by a hit.
MISS_PATH = ("kcache.cache.single_flight", "kcache.cache.compiling", "kcache.compile", "kcache.tilelang.compiler",
             "kcache.tilelang.toolchain", "kcache.tiers.remote_chain", "kcache.tiers.redis_tier",
             "kcache.tiers.s3_tier", "kcache.store.publish_batch")


@pytest.mark.tilelang
def test_a_disk_hit_in_a_fresh_process_loads_nothing_of_the_miss_path(cache_root: Path) -> None:
    """A program that builds its kernel (importing TileLang) and then opens the cache. One that opens
    the cache first warms the compile service up, which loads the service's client and nothing else
    of the miss path."""
    program = f"""
import kcache
from stress.programs.kernels import CPU_TARGET, elementwise_add
{{build_first}}
cache = kcache.KernelCache({str(cache_root)!r})
cache.get_or_compile(func if "func" in globals() else elementwise_add(), CPU_TARGET, out_idx=[2])
print(cache.stats()["{{counter}}"])
"""
    build_first = "func = elementwise_add()"
    miss = subprocess.run([sys.executable, "-c", program.format(build_first=build_first, counter="compiles")],
                          capture_output=True, text=True, cwd=PROJECT, check=True)
    assert miss.stdout.split()[-1] == "1"
    hit = program.replace("print(", "assert 1 == (")
    loaded = loaded_after(hit.format(build_first=build_first, counter="disk_hits"))
    assert "kcache.tiers.disk" in loaded and "kcache.tilelang.loader" in loaded
    assert not sorted(m for m in loaded if m.startswith(MISS_PATH)), "a hit loaded the miss path"
    warmed = loaded_after(hit.format(build_first="", counter="disk_hits"))
    assert "kcache.compile.service.client" in warmed  # the warm-up at open, in server mode (the default)
    beyond_the_client = sorted(m for m in warmed if m.startswith(MISS_PATH) and not m.startswith("kcache.compile"))
    assert not beyond_the_client, "a hit loaded the miss path beyond the compile service's client"
