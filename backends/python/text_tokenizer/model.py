"""Triton Python model ``text_tokenizer``: UTF-8 ``TEXT`` strings in, MiniLM's ``input_ids`` and
``attention_mask`` out. A thin shell over ``pipeline_ops.text`` (all logic and tests live there).
"""

import json

import triton_python_backend_utils as pb_utils
from pipeline_ops import text, triton_io


class TritonPythonModel:
    """Tokenizes every request of an ``execute`` call with one batched tokenizer call."""

    def initialize(self, args):
        """Read the parameters (see ``text.TokenizerSettings``) and build the tokenizer once."""
        config = json.loads(args["model_config"])
        self.settings = text.TokenizerSettings.from_parameters(
            triton_io.parameters(config), triton_io.version_dir(args), config["name"]
        )
        self.tokenizer = text.load_tokenizer(self.settings.tokenizer_file, self.settings.max_length)
        self.pad_id = text.pad_token_id(self.tokenizer)

    def execute(self, requests):
        """Answer each request with its tokens, or with its own INVALID_ARG error."""
        inputs = triton_io.request_inputs(pb_utils, requests, [text.TEXT_INPUT])
        results = text.tokenize_requests(
            self.tokenizer, inputs, self.pad_id, self.settings.buckets, self.settings.max_text_bytes
        )
        return triton_io.responses(pb_utils, results)
