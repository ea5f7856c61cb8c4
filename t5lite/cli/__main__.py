"""`python -m t5lite.cli ...`: the `t5lite` command (launchers run it this way on workers)."""

import sys

from t5lite.cli.main import main

sys.exit(main())
