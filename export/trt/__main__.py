"""`python -m export.trt`: see `export.trt.build`."""

from export.trt.build import main

raise SystemExit(main())
