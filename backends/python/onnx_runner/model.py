"""Triton Python model ``onnx_runner``: serves one ONNX file with ONNX Runtime on the CPU target
(MiniLM, EfficientNet). A thin shell over ``pipeline_ops.onnx_session``.
"""

from pathlib import Path

import triton_python_backend_utils as pb_utils
from pipeline_ops import onnx_session


class TritonPythonModel:
    """Runs all requests of an ``execute`` call through one ONNX Runtime session."""

    def initialize(self, args):
        """Parse the config and build the one session (``onnx_file`` is in the version folder)."""
        config = onnx_session.RunnerConfig.from_model_config(args["model_config"])
        version_dir = Path(args["model_repository"]) / str(args["model_version"])
        onnx_path = version_dir / config.onnx_file
        if not onnx_path.is_file():
            raise onnx_session.ConfigurationError(
                f"model '{config.model_name}': parameter 'onnx_file' names {onnx_path}, "
                "which does not exist"
            )
        session = onnx_session.make_session(
            onnx_path, config.intra_op_threads, config.inter_op_threads
        )
        self.runner = onnx_session.OnnxRunner(config, session)
        self.input_names = [spec.name for spec in config.inputs]

    def execute(self, requests):
        """Answer each request with its outputs, or with its own INVALID_ARG error."""
        inputs = []
        for request in requests:
            tensors = {}
            for name in self.input_names:
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                tensors[name] = None if tensor is None else tensor.as_numpy()
            inputs.append(tensors)
        responses = []
        for result in self.runner.run(inputs):
            if isinstance(result, Exception):
                error = pb_utils.TritonError(str(result), pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
            else:
                responses.append(
                    pb_utils.InferenceResponse(
                        output_tensors=[pb_utils.Tensor(n, v) for n, v in result.items()]
                    )
                )
        return responses
