"""`tools bench`: served throughput and latency against the in-process ONNX Runtime limit."""
