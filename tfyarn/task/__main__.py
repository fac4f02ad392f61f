"""``python -m tfyarn.task``: the entry point of every task, local process or YARN container alike."""

import sys

from tfyarn.task.main import main

sys.exit(main())
