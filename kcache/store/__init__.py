"""The store layer: the on-disk protocol of a root (layout, entries, manifests, locks, trust, modes).

Nothing here imports TileLang, the compile path or anything above; the CLI and gc work from it alone.
"""
