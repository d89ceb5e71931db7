"""Triton Python model ``token_classification_postprocess``: per-token logits to entities with
character offsets, one UTF-8 JSON array per text (``entities``).

A thin layer over ``pipeline_ops.token_classification``: loads the labels and the tokenizer's
strings once, and per ``execute`` call aggregates every text of every request
(``aggregation_strategy``: none, simple, first, average or max, as transformers' pipeline); a bad
request fails alone.
"""

import json

import triton_python_backend_utils as pb_utils
from pipeline_ops import classification, token_classification, triton_io


class TritonPythonModel:
    """Entities from ``logits``, ``offsets`` and ``special_tokens_mask`` of each ``TEXT``."""

    def initialize(self, args):
        """Load ``labels_file`` (a config.json's id2label) and ``tokenizer_file``, read
        ``aggregation_strategy`` and ``ignore_labels``, and check the dims."""
        config = json.loads(args["model_config"])
        parameters = triton_io.parameters(config)
        folder = triton_io.version_dir(args)
        labels = [label.decode("utf-8") for label in classification.labels_from_file(
            folder / parameters.get("labels_file", "config.json"))]
        token_classification.check_config(config, labels)
        self.settings = token_classification.AggregationSettings.from_parameters(
            parameters, labels, config["name"])
        self.view = token_classification.load_view(
            folder / parameters.get("tokenizer_file", "tokenizer.json"))

    def execute(self, requests):
        """Aggregate every request of this call; bad ones fail alone."""
        inputs = triton_io.request_inputs(pb_utils, requests, token_classification.INPUTS)
        return triton_io.responses(
            pb_utils, token_classification.entities_requests(inputs, self.view, self.settings))
