"""Watching a run: metrics writers, goodput and the profiler, plots (progress bars:
t5lite/progress.py)."""
