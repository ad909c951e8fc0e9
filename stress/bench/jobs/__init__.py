"""The processes a scenario with a run of its own starts: one machine of the deploy scenario, one rank of
the multi-GPU job, one process of the tune-once herd; and what the library scenario loads into its
plain cold runs (compile_spans, a pytest plugin)."""
