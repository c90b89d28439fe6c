"""``python -m mailsluice_lab.bench relay ...`` runs a benchmark without the main CLI."""

import sys

from mailsluice_lab.bench.command import main

raise SystemExit(main(sys.argv[1:]))
