"""TensorRT: engine builder (``python -m export.trt``) and the torch-free runtime the server's trt backend uses."""
