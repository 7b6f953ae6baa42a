"""``python -m mlmkit <command> ...`` (and ``accelerate launch -m mlmkit train ...``)."""

import sys

from mlmkit.cli import main

sys.exit(main())
