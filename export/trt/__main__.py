"""`python -m export.trt`: see `export.trt.cli`."""

from export.trt.cli import main

raise SystemExit(main())
