"""What a run keeps on disk: checkpoints (orbax), params-only dirs, the workdir's lock and
config guard; gs:// through libraries an emulator can stand in for (gcs.py)."""

from t5lite.store import gcs as _gcs

_gcs.configure()  # before any gs:// path picks its library (gcs.py says which and why)
