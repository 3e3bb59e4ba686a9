"""``python -m edgespec``: the command.

May import: cli.
"""

import sys

from .cli.main import main

sys.exit(main())
