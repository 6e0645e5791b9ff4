"""``python -m dflashd.trainer``: the embedded default job of ``dflashd start``."""

import sys

from dflashd.trainer.train import main

sys.exit(main())
