"""What a run keeps on disk: checkpoints (orbax), params-only dirs, the workdir's lock and
config guard; gs:// through libraries an emulator can stand in for (gcs.py: `gcs.configure()`
routes them; the CLI and the functions that reach gs:// call it, importing changes nothing)."""
