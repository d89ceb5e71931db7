"""Triton Python model ``text_classification_postprocess``: logits to label, score, probabilities.

A thin layer over ``pipeline_ops.classification``: loads the labels once, and per ``execute``
call classifies all requests in one vectorised pass (``activation``: softmax or sigmoid); a bad
request fails alone.
"""

import json

import triton_python_backend_utils as pb_utils
from pipeline_ops import classification, topk, triton_io


class TritonPythonModel:
    """The activation over ``logits``, the best label from ``labels_file`` and its probability."""

    def initialize(self, args):
        """Load ``labels_file`` (a config.json or a labels text file), read ``activation``
        (``softmax``, or ``sigmoid`` for multi-label) and check the dims."""
        config = json.loads(args["model_config"])
        parameters = triton_io.parameters(config)
        path = triton_io.version_dir(args) / parameters.get("labels_file", "config.json")
        self.labels = classification.labels_from_file(path)
        self.activation = classification.activation_of(parameters, config["name"])
        classification.check_config(config, self.labels)

    def execute(self, requests):
        """Classify every request of this call; bad ones fail alone."""
        inputs = triton_io.request_inputs(pb_utils, requests, [topk.INPUT_NAME])
        return triton_io.responses(
            pb_utils, classification.classify_requests(inputs, self.labels, self.activation))
