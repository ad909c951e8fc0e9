"""Preloaded by a test: its import waits until the test writes to the FIFO named by IMPORT_GATE_ENV, so
a compile service that preloads it stays not warm (no worker ready) for as long as the test wants."""

from __future__ import annotations

import os

IMPORT_GATE_ENV = "KCACHE_TEST_IMPORT_GATE"

if os.environ.get(IMPORT_GATE_ENV):
    with open(os.environ[IMPORT_GATE_ENV]) as gate:
        gate.read()
