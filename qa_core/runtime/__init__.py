"""What a server imports to run an export (torch-free): the export.json sidecar, onnxruntime sessions,
provider choice and the probes that check a provider really runs, CUDA device facts."""
