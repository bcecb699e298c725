"""`python -m moe_operator.cli ...`, the same as `moe-operator ...`."""

import sys

from moe_operator.cli import main

sys.exit(main())
