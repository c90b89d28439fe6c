"""`python -m mailsluice.benchmark relay ...` runs a benchmark without the main CLI."""

import sys

from mailsluice.benchmark import main

raise SystemExit(main(sys.argv[1:]))
