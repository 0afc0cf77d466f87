"""`python -m export.triton`: see `export.triton.repository`."""

from export.triton.repository import main

raise SystemExit(main())
