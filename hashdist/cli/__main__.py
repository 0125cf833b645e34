"""``python -m hashdist.cli``: the ``hashdist`` command."""

import sys

from hashdist.cli.launch import launch

sys.exit(launch())
