"""`python -m mailsluice` runs the command line."""

from mailsluice.cli import main

raise SystemExit(main())
