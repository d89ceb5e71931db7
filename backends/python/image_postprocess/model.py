"""Triton Python model ``image_postprocess``: classifier logits to top-k indices, scores, labels.

A thin layer over ``pipeline_ops.topk``: loads the labels file once from the version folder, and
per ``execute`` call ranks all requests in one vectorised pass; a bad request fails alone.
"""

import json

import triton_python_backend_utils as pb_utils
from pipeline_ops import topk, triton_io


class TritonPythonModel:
    """Softmax and top-k over ``logits`` with class names from ``labels_file``."""

    def initialize(self, args):
        """Load ``labels_file`` and check ``top_k`` against the config's dims."""
        config = json.loads(args["model_config"])
        self.settings = topk.PostprocessSettings.from_model_config(
            config, triton_io.parameters(config), triton_io.version_dir(args)
        )

    def execute(self, requests):
        """Rank every request of this call; bad ones fail alone."""
        inputs = triton_io.request_inputs(pb_utils, requests, [topk.INPUT_NAME])
        results = topk.postprocess_requests(inputs, self.settings.labels, self.settings.k)
        return triton_io.responses(pb_utils, results)
