"""`python -m hostengine`: run the node's DCGM host engine (see hostengine/entrypoint.py)."""

import sys

from hostengine.entrypoint import main

sys.exit(main())
