"""``python -m equishard`` is the ``equishard`` command."""

import sys

from equishard.cli import main

sys.exit(main())
