"""The benchmark suite's register: every scenario `python -m stress.bench --only NAME` runs, the module
that measures it, and the profile that breaks its time into phases (`--profile`).

A scenario measured in the bench's run has `rows(options, work, env)` in its module; one with a run of
its own (a GPU job, a tune, two machines) is its module's `python -m` command, which the bench starts
with the arguments it does not know itself."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class Scenario:
    name: str
    module: str  # under stress.bench (one with a run of its own: under stress.bench.standalone)
    profile: str | None = None  # the module under stress.bench whose main(argv) profiles it
    own_run: bool = False  # measured by `python -m stress.bench.<module>`, not in the bench's run

    def load(self) -> ModuleType:
        return importlib.import_module(f"stress.bench.{self.module}")

    def load_profile(self) -> ModuleType:
        assert self.profile is not None
        return importlib.import_module(f"stress.bench.{self.profile}")


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("herd", "herd", profile="profiles.herd"),
    Scenario("disk", "disk", profile="profiles.disk"),
    Scenario("memory", "memory"),
    Scenario("compile", "compile"),
    Scenario("cli", "cli"),
    Scenario("run", "run_cost"),
    Scenario("remote", "remote"),
    Scenario("cold", "cold", profile="profiles.cold"),
    Scenario("many", "many"),
    Scenario("triton", "triton", profile="profiles.triton"),
    Scenario("warm", "warm"),
    Scenario("tune", "standalone.tune", own_run=True),
    Scenario("tune-once", "standalone.tune_once", own_run=True),
    Scenario("dropin", "standalone.dropin", own_run=True),
    Scenario("deploy", "standalone.deploy", own_run=True),
    Scenario("bundle", "standalone.bundle", own_run=True),
    Scenario("multigpu", "standalone.multigpu", own_run=True),
    Scenario("helion", "standalone.helion", own_run=True, profile="profiles.helion"),
    Scenario("triton-library", "standalone.triton_library", own_run=True),
)
BY_NAME = {scenario.name: scenario for scenario in SCENARIOS}
IN_RUN = tuple(scenario.name for scenario in SCENARIOS if not scenario.own_run)


def scenario_of(label: str) -> str:
    """The register's name for a row's scenario label ("cold (fresh process)" -> "cold")."""
    # "triton-library (...)" before "triton": the first prefix that matches names the scenario.
    prefixes = {"disk hit": "disk", "memory hit": "memory", "warm start": "warm", "triton-library": "triton-library",
                "triton": "triton"}
    for prefix, name in prefixes.items():
        if label.startswith(prefix):
            return name
    name = label.split(" (")[0].strip()
    if name not in BY_NAME:
        raise ValueError(f"a row of no registered scenario: {label!r}")
    return name
