"""``python -m actors.cli``: the ``reverie`` command, run from a checkout."""

import sys

from actors.cli.main import main

sys.exit(main())
