"""The scenarios with runs of their own (a GPU job, a tune, two machines, a library's own tests): each
its module's `python -m` command, which `python -m stress.bench --only NAME` starts with the arguments
it does not know itself, and which writes its readings as the bench's rows to `--rows FILE`."""
