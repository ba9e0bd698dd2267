"""What Strata writes on stderr besides its results: log records (logs.py, text or JSON) and the progress
of long start-up work (progress.py)."""
