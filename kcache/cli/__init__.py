"""The command line: the `kcache` command (parser, exit-code contract, output formats, one module per
command or close group of commands) and `kcache.doctor`. Only `kcache run` imports TileLang."""
