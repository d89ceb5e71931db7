"""Triton Python model ``image_preprocess``: encoded JPEG/PNG bytes to ``pixel_values``.

A thin layer over ``pipeline_ops.image``: reads the config parameters once, and per ``execute``
call preprocesses all requests together, answering a bad request with its own INVALID_ARG error.
"""

import triton_python_backend_utils as pb_utils
from pipeline_ops import image, triton_io


class TritonPythonModel:
    """Decode, resize, centre-crop and normalise images for the classifier."""

    def initialize(self, args):
        """Read ``image_size``, ``resize_shorter`` and ``max_pixels`` from the model config."""
        self.settings = image.PreprocessSettings.from_parameters(
            triton_io.parameters(args["model_config"]), args["model_name"]
        )

    def execute(self, requests):
        """Preprocess every request of this call; bad ones fail alone."""
        inputs = triton_io.request_inputs(pb_utils, requests, [image.INPUT_NAME])
        return triton_io.responses(pb_utils, image.preprocess_requests(inputs, self.settings))
