"""Everything seqio: objectives, formats, metrics, and the registered tasks and mixtures.

Importing this package registers t5lite's tasks and mixtures with seqio's registries (no data
is read; see registry.py). `t5lite tasks list` shows them.
"""

from t5lite.tasks import registry as _registry

_registry.register_builtin()

from t5lite.tasks import classification as _classification  # noqa: E402  (GPT heads)

_classification.register()

from t5lite.tasks import ablation_tasks as _ablation_tasks  # noqa: E402  (T5 paper tables)

_ablation_tasks.register()
