"""The path README's Python API named before the packages split: the same module as
t5lite.eval.decoding (``from t5lite import decoding`` keeps working)."""

import sys

from t5lite.eval import decoding as _decoding

sys.modules[__name__] = _decoding
