"""The benchmark suite, `python -m stress.bench`: one module per scenario measured in the bench's run
here, the scenarios with runs of their own in `standalone/`, with rooms for what they share (`suite/`:
the register, what each scenario needs, rows and their table, timing, the children's herd, what an own
run shares, the dataset they record into, its goals and plots), the profiles that break a scenario's
time into phases (`profiles/`, run by `--profile`) and the processes a standalone scenario starts (`jobs/`).

The harness beside it (`python -m stress`: workers, chaos, invariants) lives in stress/ itself, the
programs it runs in stress/programs and the test servers in stress/servers; the suite imports them,
never the other way."""
