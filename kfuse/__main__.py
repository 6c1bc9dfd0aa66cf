"""``python -m kfuse`` runs the command line."""

import sys

from kfuse.cli.main import main

sys.exit(main())
