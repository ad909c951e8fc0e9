"""The cache layer: `KernelCache`, the one facade over the tiers, the store and the compile path."""
