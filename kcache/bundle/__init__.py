"""Deployment bundles: export, import (`importer`), the reader, the manifest, the sections beside
TileLang's kernels, the staging and the coverage check. The command line (kcache.cli) sits above."""
