"""`tools build-repo`: from the spec to a Triton model repository, one module per stage.

spec -> torch2onnx -> parity -> [gpu] onnx2trt -> config / ensemble -> repository + manifest.
"""
