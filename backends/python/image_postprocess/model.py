"""Triton Python model ``image_postprocess``: classifier logits to top-k indices, scores, labels.

A thin layer over ``pipeline_ops.topk``: loads the labels file once from the version folder, and
per ``execute`` call ranks all requests in one vectorised pass; a bad request fails alone.
"""

import json
import pathlib

import triton_python_backend_utils as pb_utils

from pipeline_ops import topk
from pipeline_ops.batching import InvalidInput


class TritonPythonModel:
    """Softmax and top-k over ``logits`` with class names from ``labels_file``."""

    def initialize(self, args):
        """Read ``top_k`` and ``labels_file`` (relative to the version folder) from the config."""
        name = args["model_name"]
        config = json.loads(args["model_config"])
        parameters = {
            key: value["string_value"] for key, value in config.get("parameters", {}).items()
        }
        version_dir = pathlib.Path(args["model_repository"]) / args["model_version"]
        labels_path = version_dir / parameters.get("labels_file", "labels.txt")
        if not labels_path.is_file():
            raise ValueError(f"model {name!r}: labels_file {labels_path} does not exist")
        self.labels = topk.load_labels(labels_path)
        try:
            self.k = int(parameters.get("top_k", "5"))
        except ValueError:
            raise ValueError(f"model {name!r}: parameter 'top_k' must be an integer") from None
        if not 1 <= self.k <= len(self.labels):
            raise ValueError(
                f"model {name!r}: top_k={self.k} must be between 1 and {len(self.labels)} "
                f"(the labels in {labels_path})"
            )
        logits = pb_utils.get_input_config_by_name(config, topk.INPUT_NAME)
        if logits is None or [int(d) for d in logits["dims"]] != [len(self.labels)]:
            raise ValueError(
                f"model {name!r}: input {topk.INPUT_NAME!r} must have dims [{len(self.labels)}], "
                f"one per label in {labels_path}"
            )
        for output in topk.OUTPUTS:
            entry = pb_utils.get_output_config_by_name(config, output)
            if entry is None:
                raise ValueError(f"model {name!r}: the config has no output {output!r}")
            dims = [int(d) for d in entry["dims"]]
            if dims != [self.k]:
                raise ValueError(
                    f"model {name!r}: output {output!r} has dims {dims}, expected "
                    f"[{self.k}] for top_k={self.k}"
                )

    def execute(self, requests):
        """Rank every request of this call; bad ones fail alone."""
        inputs = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, topk.INPUT_NAME)
            inputs.append({topk.INPUT_NAME: None if tensor is None else tensor.as_numpy()})
        responses = []
        for result in topk.postprocess_requests(inputs, self.labels, self.k):
            if isinstance(result, InvalidInput):
                error = pb_utils.TritonError(str(result), pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
            else:
                tensors = [pb_utils.Tensor(key, value) for key, value in result.items()]
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
