"""`python -m export.triton`: see `export.triton.cli`."""

from export.triton.cli import main

raise SystemExit(main())
