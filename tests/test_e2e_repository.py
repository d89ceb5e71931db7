"""The repository `tools build-repo` writes from repository.yaml, as the real server sees it.

Every generated config is loaded by the embedded tritonserver with auto-completion off, and every
model (not only the pipelines) answers a real inference with outputs of the declared shapes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

IMAGE = Path(__file__).parent / "data" / "images" / "chelsea_small.jpg"
TOKENS = np.array([[101, 1037, 4937, 2006, 1037, 13523, 102]], dtype=np.int64)


def _inputs() -> dict[str, list[httpclient.InferInput]]:
    def tensor(name, value, datatype):
        infer_input = httpclient.InferInput(name, list(value.shape), datatype)
        infer_input.set_data_from_numpy(value)
        return infer_input

    text = np.array([[b"a cat on a mat"]], dtype=np.object_)
    image = np.array([[IMAGE.read_bytes()]], dtype=np.object_)
    rng = np.random.default_rng(0)
    return {
        "text_tokenizer": [tensor("TEXT", text, "BYTES")],
        "minilm_encoder": [
            tensor("input_ids", TOKENS, "INT64"),
            tensor("attention_mask", np.ones_like(TOKENS), "INT64"),
        ],
        "minilm_encoder_int8": [
            tensor("input_ids", TOKENS, "INT64"),
            tensor("attention_mask", np.ones_like(TOKENS), "INT64"),
        ],
        "text_embedding": [tensor("TEXT", text, "BYTES")],
        "minilm_encoder_bf16": [
            tensor("input_ids", TOKENS, "INT64"),
            tensor("attention_mask", np.ones_like(TOKENS), "INT64"),
        ],
        "text_embedding_int8": [tensor("TEXT", text, "BYTES")],
        "text_embedding_bf16": [tensor("TEXT", text, "BYTES")],
        "image_preprocess": [tensor("IMAGE", image, "BYTES")],
        "efficientnet_lite0": [
            tensor("pixel_values", rng.uniform(-1, 1, (1, 3, 224, 224)).astype(np.float32), "FP32")
        ],
        "image_postprocess": [
            tensor("logits", rng.normal(size=(1, 1000)).astype(np.float32), "FP32")
        ],
        "image_classification": [tensor("IMAGE", image, "BYTES")],
    }


def _file_config(repository: Path, model: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(
        (repository / model / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )


@pytest.mark.torch
@pytest.mark.server
def test_server_runs_with_auto_completion_off(triton_server):
    assert "--disable-auto-complete-config" in triton_server.command()


@pytest.mark.torch
@pytest.mark.server
def test_every_model_of_the_spec_is_served(triton_server, built_repository):
    served = set(triton_server.models)
    built = {p.name for p in Path(built_repository).iterdir() if (p / "config.pbtxt").is_file()}
    assert served == built == set(_inputs())


@pytest.mark.torch
@pytest.mark.server
@pytest.mark.parametrize("model", sorted(_inputs()))
def test_each_model_answers_with_the_declared_output_shapes(triton_server, built_repository, model):
    client = httpclient.InferenceServerClient(triton_server.http_url, network_timeout=60)
    try:
        config = _file_config(Path(built_repository), model)
        served = json_format.ParseDict(
            client.get_model_config(model),
            model_config_pb2.ModelConfig(),
            ignore_unknown_fields=True,
        )
        # What the server runs is what the file says: no input or output was added or changed.
        assert [(t.name, t.data_type, list(t.dims)) for t in served.input] == [
            (t.name, t.data_type, list(t.dims)) for t in config.input
        ]
        assert [(t.name, t.data_type, list(t.dims)) for t in served.output] == [
            (t.name, t.data_type, list(t.dims)) for t in config.output
        ]

        result = client.infer(model, _inputs()[model])
        for output in config.output:
            value = result.as_numpy(output.name)
            assert value is not None, output.name
            expected = [1, *output.dims]
            assert len(value.shape) == len(expected)
            assert all(e == -1 or e == v for e, v in zip(expected, value.shape)), (
                output.name,
                value.shape,
                expected,
            )
    finally:
        client.close()
