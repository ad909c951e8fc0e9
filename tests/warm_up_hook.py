"""Preloaded by tests/test_template_warm_up.py: a module with a template warm-up hook that says, in the
file named by KCACHE_TEST_WARM_UP_MARK, which process ran it and under which CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import json
import os


def warm_up_template() -> None:
    with open(os.environ["KCACHE_TEST_WARM_UP_MARK"], "x") as mark:
        json.dump({"pid": os.getpid(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}, mark)
