"""`python -m entangle_ext ...` = the `entangle-unlearn` command line (see entangle_ext.cli)."""
import sys

from .cli import main

sys.exit(main())
