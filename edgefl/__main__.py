"""`python -m edgefl` is the `edgefl` command."""

from edgefl.cli import main

raise SystemExit(main())
