"""Triton Python model ``text_tokenizer``: UTF-8 ``TEXT`` strings in, MiniLM's ``input_ids`` and
``attention_mask`` out. A thin shell over ``pipeline_ops.text`` (all logic and tests live there).
"""

import json

import triton_python_backend_utils as pb_utils
from pipeline_ops import admission, text, triton_io


class TritonPythonModel:
    """Tokenizes every request of an ``execute`` call with one batched tokenizer call."""

    def initialize(self, args):
        """Read the parameters (see ``text.TokenizerSettings``) and build the tokenizer once."""
        config = json.loads(args["model_config"])
        params = triton_io.parameters(config)
        self.settings = text.TokenizerSettings.from_parameters(
            params, triton_io.version_dir(args), config["name"]
        )
        self.tokenizer = text.load_tokenizer(self.settings.tokenizer_file, self.settings.max_length)
        self.pad_id = text.pad_token_id(self.tokenizer)
        gate = admission.AdmissionSettings.from_parameters(params, config["name"])
        self.gate = admission.QueueGate(gate) if gate else None

    def execute(self, requests):
        """Answer each request with its tokens, or with its own INVALID_ARG error; requests the
        queue gate refuses get UNAVAILABLE before any work is done for them."""
        admitted = self.gate.admit(len(requests)) if self.gate else len(requests)
        inputs = triton_io.request_inputs(pb_utils, requests[:admitted], [text.TEXT_INPUT])
        results = text.tokenize_requests(
            self.tokenizer, inputs, self.pad_id, self.settings.buckets, self.settings.max_text_bytes
        )
        refused = [self.gate.refusal()] * (len(requests) - admitted) if self.gate else []
        return triton_io.responses(pb_utils, [*results, *refused])

    def finalize(self):
        """Stop the queue gate's polling thread."""
        if self.gate:
            self.gate.close()
