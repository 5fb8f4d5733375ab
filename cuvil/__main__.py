"""``python -m cuvil``: the same command as the ``cuvil`` console script."""

import sys

from cuvil.cli import main

sys.exit(main())
