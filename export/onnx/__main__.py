"""`python -m export.onnx`: see `export.onnx.cli`."""

from export.onnx.cli import main

raise SystemExit(main())
