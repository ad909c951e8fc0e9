"""A threaded program's first Triton compiles, as a training or serving process makes them: three
threads race their first compiles (the add, the softmax and the matmul of the operator library, for
sm_90) while other threads hold what a fork of the process would inherit locked:
- one is importing a module (KT_SLOW_MODULE, on sys.path from KT_SLOW_DIR) whose body waits for a line
  on the FIFO KT_IMPORT_GATE: its module lock is held until the compiles are done;
- one holds a lock of the program's own and the lock of a logging handler of the program's.
Then it lets the import finish, and prints one JSON object: each kernel's cubin sha256 (or its error),
and whether the holders were still holding when the compiles ended.

    python tests/triton_threads_program.py
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import threading

from stress.programs.triton_programs.compile import KERNELS, compile_kernel


def main() -> None:
    sys.path.insert(0, os.environ["KT_SLOW_DIR"])
    importing = threading.Thread(target=importlib.import_module, args=(os.environ["KT_SLOW_MODULE"],),
                                 name="importer", daemon=True)
    importing.start()
    handler = logging.StreamHandler(sys.stderr)
    logging.getLogger("the-program").addHandler(handler)
    own_lock, held, release = threading.Lock(), threading.Event(), threading.Event()

    def hold() -> None:
        with own_lock, handler.lock:
            held.set()
            release.wait()

    holder = threading.Thread(target=hold, name="holder", daemon=True)
    holder.start()
    held.wait()
    results: dict[str, str] = {}
    start = threading.Barrier(len(KERNELS))

    def race(name: str) -> None:
        start.wait()
        try:
            results[name] = compile_kernel(name)
        except Exception as err:  # noqa: BLE001 - reported
            results[name] = f"{type(err).__name__}: {err}"

    racers = [threading.Thread(target=race, args=(name,), name=f"compile-{name}") for name in KERNELS]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join()
    still_importing, still_holding = importing.is_alive(), own_lock.locked()
    with open(os.environ["KT_IMPORT_GATE"], "w") as gate:  # the import may finish now
        gate.write("go\n")
    release.set()
    importing.join()
    holder.join()
    print(json.dumps({"cubins": results, "importing_meanwhile": still_importing, "holding_meanwhile": still_holding}))


if __name__ == "__main__":
    main()
