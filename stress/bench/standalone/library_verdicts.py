"""pytest's verdicts in the runs of `python -m stress.bench --only triton-library`: each test's outcome,
read from pytest's own JUnit XML (no plugin in the run), and the tests whose outcome is not the same in
every run. Runs whose verdicts differ did different work, so their timings are not compared."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path

ABSENT = "absent"  # a test that a run did not report


def verdicts(junit: Path) -> dict[str, str]:
    """Each test's outcome in a JUnit XML of pytest's: passed, failed, error or skipped (an xfail is
    skipped there); a test reported twice (a failure, then an error at its teardown) has both, sorted."""
    found: dict[str, list[str]] = {}
    for case in ElementTree.parse(junit).iter("testcase"):
        tags = {child.tag for child in case}
        outcome = next((name for tag, name in (("error", "error"), ("failure", "failed"), ("skipped", "skipped"))
                        if tag in tags), "passed")
        found.setdefault(f"{case.get('classname')}::{case.get('name')}", []).append(outcome)
    return {test: "+".join(sorted(outcomes)) for test, outcomes in found.items()}


def summary(found: dict[str, str]) -> str:
    """"13 tests: 2 failed, 11 passed"."""
    counts = Counter(found.values())
    return f"{len(found)} tests: " + ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))


def differing(runs: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """`runs`: a run's name -> its verdicts. Every test whose verdict is not the same in every run:
    test -> {run: verdict}, ABSENT where a run did not report it. Empty where all runs agree."""
    found = {}
    for test in sorted(set().union(*runs.values())):
        seen = {run: verdict.get(test, ABSENT) for run, verdict in runs.items()}
        if len(set(seen.values())) > 1:
            found[test] = seen
    return found
