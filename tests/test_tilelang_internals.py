"""A TileLang that lacks an internal kcache uses still gets its kernels built, equal to plain TileLang's.

Each entry of kcache/tilelang/internals.py is hidden in turn, in a fresh process
(tests/internals_driver.py says how: the name is gone where kcache looks for it, while TileLang keeps
its own objects, as a TileLang that renamed it would). The kernel that `tilelang.compile` returns with
kcache installed has plain TileLang's device source, host source and machine code:
- an essential internal: kcache's layer is not used at all. One warning names the missing name and
  the fix, TileLang is left unpatched (nothing compiled into kcache's root), and `get_or_compile`
  raises TileLangUnsupported, one line;
- any other: kcache still compiles and stores the kernel, through the place's own fallback.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kcache.tilelang.internals import INTERNALS, Internal

from .background import Started, low_priority, take
from .internals_runner import TRANSFER_MODULES

pytestmark = pytest.mark.tilelang

RUNNER = Path(__file__).with_name("internals_runner.py")
OUTPUT = ("device_source", "host_source", "machine_code")


def start_hidden(work: Path) -> Started:
    """Every row, one process after another, at a low priority beside the other tests (tests/background.py)."""
    with open(work / "runner.stderr", "wb") as stderr:
        runner = subprocess.Popen([*low_priority(), sys.executable, str(RUNNER), str(work)],
                                  stdout=subprocess.DEVNULL, stderr=stderr)
    return Started({"runner": (runner, work / "rows.json")}, {"work": work})


BACKGROUND = {"hidden_internals": start_hidden}


@pytest.fixture(scope="module")
def hidden_internals(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict, list[dict]]]:
    started = take("hidden_internals", start_hidden, tmp_path_factory)
    work = started.facts["work"]
    try:
        runner, rows_file = started.drivers["runner"]
        runner.wait(timeout=1800)
        assert runner.returncode == 0, (work / "runner.stderr").read_text(errors="replace")[-3000:]
        ran = json.loads(rows_file.read_text())
        failed = [f"{hidden}: {(work / f'{index}.stderr').read_text(errors='replace')[-2000:]}"
                  for index, (hidden, status) in enumerate(ran) if status != 0]
        assert not failed, "\n".join(failed)
        rows = [json.loads((work / f"{index}.json").read_text()) for index in range(len(ran))]
        yield rows[0], rows[1:]
    finally:
        started.stop()


def check(item: Internal, row: dict, plain: dict) -> list[str]:
    """What is wrong with the kernel built with `item` hidden, against plain TileLang's (empty: nothing)."""
    hidden = f"{item.module}.{item.name}"
    wrong = [f"{hidden}: {field} differs from plain TileLang's" for field in OUTPUT if row[field] != plain[field]]
    if item.essential:
        if not (row["compiles"] == 0 and row["entries"] == 0 and not row["installed"]):
            wrong.append(f"{hidden}: kcache's layer was used without it ({row})")
        if len(row["warnings"]) != 1 or hidden not in row["warnings"][0] or "pip install" not in row["warnings"][0]:
            wrong.append(f"{hidden}: not one warning naming it and the fix: {row['warnings']}")
        message = row["get_or_compile"]
        if hidden not in message or "\n" in message or "pip install" not in message:
            wrong.append(f"{hidden}: get_or_compile did not refuse in one line naming it: {message!r}")
    else:
        if not (row["compiles"] == 1 and row["entries"] == 1 and row["installed"]):
            wrong.append(f"{hidden}: kcache did not compile and store the kernel through its fallback ({row})")
        if row["get_or_compile"] != "served":
            wrong.append(f"{hidden}: get_or_compile refused: {row['get_or_compile']}")
        sent = [line for line in row["warnings"] if "cannot be sent to a compile worker" in line]
        if item.module in TRANSFER_MODULES and not sent:
            wrong.append(f"{hidden}: the kernel was sent to a worker without the transfer's check ({row['warnings']})")
        if item.name == "lower_with_context" and row.get("warm_up_lowered") is not False:
            wrong.append(f"{hidden}: the template's warm-up did not fall back ({row})")
    return wrong


def test_every_internal_hidden_in_turn_still_gives_tilelangs_kernel(
        hidden_internals: tuple[dict, list[dict]]) -> None:
    plain, (unhidden, *rows) = hidden_internals
    assert unhidden == {**plain, "compiles": 1, "entries": 1, "warnings": [], "installed": True,
                        "get_or_compile": "served"}
    assert len(rows) == len(INTERNALS)
    wrong = [problem for item, row in zip(INTERNALS, rows) for problem in check(item, row, plain)]
    assert not wrong, "\n".join(wrong)


def test_every_internal_kcache_imports_is_listed() -> None:
    """A name imported from TileLang in kcache's code is in the table, or is public TileLang API."""
    public = {("tilelang", "env"), ("tilelang", "language"), ("tilelang.autotuner.param", "AutotuneResult"),
              ("tilelang.autotuner.tuner", "AutoTuner"), ("tilelang.contrib", "nvcc"), ("tilelang", "_ffi_api"),
              ("tilelang.cuda", "backend"), ("tilelang.layout", "Layout"), ("tilelang.layout", "Fragment")}
    listed = {(item.module, item.name.split(".")[0]) for item in INTERNALS} | public
    kcache_dir = Path(__file__).resolve().parents[1] / "kcache"
    unlisted = []
    for path in sorted(kcache_dir.rglob("*.py")):
        for line in path.read_text().splitlines():
            words = line.split()
            if len(words) >= 4 and words[0] == "from" and words[1].startswith("tilelang") and words[2] == "import":
                names = " ".join(words[3:]).split("#")[0].replace("(", "").replace(")", "")
                for name in (part.split(" as ")[0].strip() for part in names.split(",")):
                    if name and (words[1], name) not in listed:
                        unlisted.append(f"{path.relative_to(kcache_dir.parent)}: {words[1]}.{name}")
    assert not unlisted, "not in kcache/tilelang/internals.py: " + ", ".join(unlisted)
