"""What a run keeps on disk: checkpoints (orbax), params-only dirs, the workdir's lock and config guard."""
