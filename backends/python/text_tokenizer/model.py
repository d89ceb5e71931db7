"""Triton Python model ``text_tokenizer``: UTF-8 ``TEXT`` strings (and ``TEXT_PAIR`` for pair
models) in, ``input_ids`` and ``attention_mask`` (and ``token_type_ids``, ``offsets`` and
``special_tokens_mask`` when the config declares them) out. A thin shell over
``pipeline_ops.text`` (all logic and tests live there).
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
            params, triton_io.version_dir(args), config["name"],
            [t["name"] for t in config["input"]], [t["name"] for t in config["output"]],
        )
        self.tokenizer = text.load_tokenizer(self.settings.tokenizer_file, self.settings.max_length)
        self.pad_id = text.pad_token_id(self.tokenizer)
        gate = admission.AdmissionSettings.from_parameters(params, config["name"])
        self.gate = admission.QueueGate(gate) if gate else None

    def execute(self, requests):
        """Answer each request with its tokens, or with its own INVALID_ARG error; requests the
        queue gate refuses get UNAVAILABLE before any work is done for them."""
        admitted = self.gate.admit(len(requests)) if self.gate else len(requests)
        settings = self.settings
        names = [text.TEXT_INPUT, text.PAIR_INPUT] if settings.pairs else [text.TEXT_INPUT]
        inputs = triton_io.request_inputs(pb_utils, requests[:admitted], names)
        results = text.tokenize_requests(
            self.tokenizer, inputs, self.pad_id, settings.buckets, settings.max_text_bytes,
            pairs=settings.pairs, token_types=settings.token_types, offsets=settings.offsets,
            prompt=settings.prompt,
        )
        refused = [self.gate.refusal()] * (len(requests) - admitted) if self.gate else []
        return triton_io.responses(pb_utils, [*results, *refused])

    def finalize(self):
        """Stop the queue gate's polling thread."""
        if self.gate:
            self.gate.close()
