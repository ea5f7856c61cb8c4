"""Watching a run: metrics writers, goodput and the profiler, progress output, plots."""
