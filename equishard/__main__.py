"""``python -m equishard`` runs the command line."""

import sys

from equishard.cli import main

sys.exit(main())
