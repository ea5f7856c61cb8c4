"""t5lite: BERT, GPT and T5 in JAX/Flax, from one CPU to a TPU pod."""

__version__ = "0.1.0"

from t5lite.errors import UserError  # noqa: F401
