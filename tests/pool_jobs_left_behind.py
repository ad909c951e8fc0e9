"""Imported only by pool_jobs.remember: a module a job leaves behind in its worker."""
