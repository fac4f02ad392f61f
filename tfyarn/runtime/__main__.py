"""``python -m tfyarn.runtime``: the entry point of every task, local process or YARN container alike."""

import sys

from tfyarn.runtime.main import main

sys.exit(main())
