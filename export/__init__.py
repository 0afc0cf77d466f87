"""Export the content-stream QA model to ONNX, TensorRT and Triton."""
