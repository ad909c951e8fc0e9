"""What the scenarios share: the register (`scenarios`), what each needs on this machine (`needs`), the
herd, timing and row of the bench's table (`rows`), the dataset (`dataset`), its goals and plots."""
