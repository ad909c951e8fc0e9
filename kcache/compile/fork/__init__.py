"""The fork-of-the-caller lane: the job's own objects, in memory, in a fork of this process.

Nothing is pickled into the fork; the caller's callbacks are called back over its pipes, and the
forks of all processes are bounded machine-wide by `kcache.compile.compile_slots`.
"""
