"""`python -m roformer ...` (also what `accelerate launch -m roformer ...` runs)."""

import sys

from roformer.cli import main

sys.exit(main())
