"""Everything seqio: objectives, formats, metrics, and the registered tasks and mixtures.

Importing this package registers t5lite's tasks and mixtures with seqio's registries (no data
is read; see registry.py): those t5lite/task_catalog.py lists, by builtin.py. `t5lite tasks
list` shows them.
"""

from t5lite.tasks import builtin as _builtin

_builtin.register()
