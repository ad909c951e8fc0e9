"""Runs tests/internals_driver.py once per row, one after another (tests/test_tilelang_internals.py).

    python tests/internals_runner.py WORK

The rows: plain TileLang, kcache with nothing hidden, then each entry of kcache/tilelang/internals.py
hidden in turn. Each run is a fresh process (one at a time: each holds a TileLang in memory), its
result in WORK/<n>.json and its stderr in WORK/<n>.stderr; WORK/rows.json, written last, lists
(hidden, exit status) per row. Started at a low priority beside the rest of the suite (tests/background.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kcache.tilelang.internals import INTERNALS  # noqa: E402 - no TileLang import

DRIVER = Path(__file__).with_name("internals_driver.py")
# Sent to a compile worker where the transfer's internals are there: a pool, so that hiding one shows
# the kernel compiled without the transfer. The rest compile in the caller, the quickest.
TRANSFER_MODULES = ("tilelang.layout", "tilelang._ffi_api")


def main() -> None:
    work = Path(sys.argv[1])
    rows = []
    for index, hidden in enumerate(["plain", "none", *(f"{item.module}:{item.name}" for item in INTERNALS)]):
        isolation = "pool" if hidden.split(":")[0] in TRANSFER_MODULES else "inprocess"
        env = {**os.environ, "KCACHE_COMPILE_ISOLATION": isolation, "KCACHE_COMPILE_WORKERS": "1",
               "TILELANG_CACHE_DIR": str(work / "tilelang-cache")}
        env.pop("TILELANG_DEFAULT_TARGET", None)
        with open(work / f"{index}.stderr", "wb") as stderr:
            done = subprocess.run([sys.executable, str(DRIVER), hidden, str(work / f"{index}-root"),
                                   str(work / f"{index}.json")], env=env, stdout=subprocess.DEVNULL, stderr=stderr,
                                  timeout=600)
        rows.append((hidden, done.returncode))
    (work / "rows.json").write_text(json.dumps(rows))


if __name__ == "__main__":
    main()
