"""`python -m mailsluice` runs the command line."""

from mailsluice.cli.main import main

raise SystemExit(main())
