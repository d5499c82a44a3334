"""``python -m launchers.study``: see :mod:`launchers.study`."""

import sys

from launchers.study import main

sys.exit(main())
