"""The TileLang backend. `backend` is the interface the cache calls; the hit path (`target`,
`identity`, `fingerprint`, `loader`) never loads the miss path (`compiler`, `toolchain`)."""
