"""``python -m harmonaize.harmonctl``: the same as the ``harmonctl`` command."""

import sys

from harmonaize.harmonctl.cli import main

sys.exit(main())
