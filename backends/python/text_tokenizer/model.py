"""Triton Python model ``text_tokenizer``: UTF-8 ``TEXT`` strings in, MiniLM's ``input_ids`` and
``attention_mask`` out. A thin shell over ``pipeline_ops.text`` (all logic and tests live there).
"""

import json
from pathlib import Path

import triton_python_backend_utils as pb_utils
from pipeline_ops import text


class TritonPythonModel:
    """Tokenizes every request of an ``execute`` call with one batched tokenizer call."""

    def initialize(self, args):
        """Read ``tokenizer_file``, ``max_length`` (optional: ``max_text_bytes``,
        ``length_buckets``) and build the tokenizer once."""
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        version_dir = Path(args["model_repository"]) / str(args["model_version"])
        name = config.get("name", "text_tokenizer")

        def integer(key, default):
            try:
                return int(params.get(key) or default)
            except ValueError:
                raise ValueError(
                    f"model '{name}': parameter '{key}' must be an integer, got {params[key]!r}"
                ) from None

        max_length = integer("max_length", 256)
        self.max_text_bytes = integer("max_text_bytes", text.DEFAULT_MAX_TEXT_BYTES)
        # Optional fixed-shape padding (comma-separated lengths). Empty: each request is padded
        # to its own longest text; the encoder's ragged batching merges requests (docs/padding.md).
        buckets = params.get("length_buckets", "").strip()
        try:
            self.buckets = tuple(int(b) for b in buckets.split(",")) if buckets else ()
        except ValueError:
            raise ValueError(
                f"model '{name}': parameter 'length_buckets' must be comma-separated integers, "
                f"got {buckets!r}"
            ) from None
        tokenizer_file = version_dir / (params.get("tokenizer_file") or "tokenizer.json")
        self.tokenizer = text.load_tokenizer(tokenizer_file, max_length)
        self.pad_id = self.tokenizer.token_to_id("[PAD]") or 0

    def execute(self, requests):
        """Answer each request with its tokens, or with its own INVALID_ARG error."""
        inputs = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, text.TEXT_INPUT)
            inputs.append({text.TEXT_INPUT: None if tensor is None else tensor.as_numpy()})
        responses = []
        for result in text.tokenize_requests(
            self.tokenizer, inputs, self.pad_id, self.buckets, self.max_text_bytes
        ):
            if isinstance(result, Exception):
                error = pb_utils.TritonError(str(result), pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
            else:
                responses.append(
                    pb_utils.InferenceResponse(
                        output_tensors=[pb_utils.Tensor(n, result[n]) for n in text.OUTPUTS]
                    )
                )
        return responses
