"""Keeping a root in shape: per-process stats, LRU eviction, garbage collection of staging and locks."""
