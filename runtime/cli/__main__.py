"""`python -m runtime.cli`: the `turnstile` command."""

import sys

from runtime.cli import main

sys.exit(main())
