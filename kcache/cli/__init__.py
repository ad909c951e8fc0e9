"""Tools over a root: the `kcache` command and `kcache.doctor`. Only `kcache run` imports TileLang."""
