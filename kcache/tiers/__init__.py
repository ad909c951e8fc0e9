"""The lookup tiers: memory (in process), disk (verified entries of local roots), remote (Redis, S3)."""
