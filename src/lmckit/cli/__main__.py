"""``python -m lmckit.cli``: the command line, as the ``lmckit`` entry point runs it."""

import sys

from lmckit.cli import main

sys.exit(main())
