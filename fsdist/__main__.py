"""``python -m fsdist``: the command line (cli/main.py)."""

import sys

from .cli.main import main

sys.exit(main())
