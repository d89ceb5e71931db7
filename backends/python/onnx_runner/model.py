"""Triton Python model ``onnx_runner``: serves one ONNX file with ONNX Runtime on the CPU target
(MiniLM, EfficientNet). A thin shell over ``pipeline_ops.onnx_session``.
"""

import triton_python_backend_utils as pb_utils
from pipeline_ops import onnx_session, triton_io


class TritonPythonModel:
    """Runs all requests of an ``execute`` call through one ONNX Runtime session."""

    def initialize(self, args):
        """Build the one session from ``onnx_file`` in the version folder."""
        self.runner = onnx_session.load_runner(args["model_config"], triton_io.version_dir(args))
        self.input_names = [spec.name for spec in self.runner.config.inputs]

    def execute(self, requests):
        """Answer each request with its outputs or its own error (INVALID_ARG or INTERNAL)."""
        inputs = triton_io.request_inputs(pb_utils, requests, self.input_names)
        return triton_io.responses(pb_utils, self.runner.run(inputs))
