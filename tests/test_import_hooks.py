"""kcache.import_hooks: one-shot hooks around a module's import (what `import kcache` relies on to watch
TileLang's callback registrations when TileLang is imported after it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from .helpers import child_env

PROGRAM = textwrap.dedent('''
    import sys
    from kcache.import_hooks import after_import, before_import
    events = []
    before_import("hooked", lambda: events.append("before " + str("hooked" in sys.modules)))
    after_import("hooked", lambda: events.append("after " + str(sys.modules["hooked"].VALUE)))
    after_import("broken", lambda: 1 / 0)
    import hooked
    try:
        import broken
    except ZeroDivisionError:
        events.append("raised from the import")
    import broken  # the hook is gone: a plain import now
    import hooked  # once only
    after_import("hooked", lambda: events.append("loaded already"))
    before_import("hooked", lambda: events.append("never"))
    print(events, broken.VALUE, [f.name for f in sys.meta_path if type(f).__module__ == "kcache.import_hooks"])
''')


def test_hooks_run_once_around_the_import_and_a_failing_one_fails_that_import(tmp_path: Path) -> None:
    (tmp_path / "hooked.py").write_text("VALUE = 7\n")
    (tmp_path / "broken.py").write_text("VALUE = 'imported'\n")
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60,
                          env=child_env(PYTHONPATH=f"{child_env()['PYTHONPATH']}:{tmp_path}"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ("['before False', 'after 7', 'raised from the import', 'loaded already'] imported "
                                   "['logging', 'tvm_ffi']")
    # What is left is `import kcache`'s own hooks: it masks its log's URLs once `logging` loads
    # (kcache.redaction), and watches TileLang's callbacks once TVM's FFI loads.
