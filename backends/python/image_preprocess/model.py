"""Triton Python model ``image_preprocess``: encoded JPEG/PNG bytes to ``pixel_values``.

A thin layer over ``pipeline_ops.image``: reads the config parameters once, and per ``execute``
call preprocesses all requests together, answering a bad request with its own INVALID_ARG error.
"""

import json

import triton_python_backend_utils as pb_utils

from pipeline_ops import image
from pipeline_ops.batching import InvalidInput


class TritonPythonModel:
    """Decode, resize, centre-crop and normalise images for the classifier."""

    def initialize(self, args):
        """Read ``image_size``, ``resize_shorter`` and ``max_pixels`` from the model config."""
        config = json.loads(args["model_config"])
        parameters = {
            name: value["string_value"] for name, value in config.get("parameters", {}).items()
        }
        try:
            self.settings = image.PreprocessSettings.from_parameters(parameters)
        except ValueError as exc:
            raise ValueError(f"model {args['model_name']!r}: {exc}") from None

    def execute(self, requests):
        """Preprocess every request of this call; bad ones fail alone."""
        inputs = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, image.INPUT_NAME)
            inputs.append({image.INPUT_NAME: None if tensor is None else tensor.as_numpy()})
        responses = []
        for result in image.preprocess_requests(inputs, self.settings):
            if isinstance(result, InvalidInput):
                error = pb_utils.TritonError(str(result), pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
            else:
                tensors = [pb_utils.Tensor(name, value) for name, value in result.items()]
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
