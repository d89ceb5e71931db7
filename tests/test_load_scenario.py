"""``tools.load.scenario``: the load of any pipeline or model, derived from the spec's inputs.

No server: a spec with entries named unlike the shipped examples (two added with ``tools add
onnx`` on graphs the tests write, the rest as a user writes them), and the shipped spec for the
two examples' payloads.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.add_helpers import WORDS, save_tokenizer
from tests.scenario_helpers import ids_onnx, linear_onnx, start_spec
from tools import paths
from tools.add.command import add_model
from tools.build_repo.spec import load_spec
from tools.load.scenario import (
    OPT_FACTOR,
    SAFE_VOCABULARY,
    DataError,
    InputKind,
    UnknownScenario,
    build_scenario,
    load_images,
    load_texts,
    scenario_names,
)

VOCABULARY = len(WORDS) + 7  # save_tokenizer's WordPiece vocabulary

# Hand-written entries beside the added ones: a tokenizer whose input is QUERY, an image step
# whose input is PICTURE, a pair tokenizer, and the pipeline that joins the tokenizer and a raw
# model with no tokenizer beside its file.
_ENTRIES = """
python_models:
  words:
    backend: text_tokenizer
    max_batch_size: 8
    inputs:
      - {name: QUERY, dtype: string, shape: [batch, 1]}
    outputs:
      - {name: input_ids, dtype: int64, shape: [batch, sequence]}
      - {name: attention_mask, dtype: int64, shape: [batch, sequence]}
    parameters: {tokenizer_file: tokenizer.json, max_length: 32}
    files: {tokenizer.json: words/tokenizer.json}
  pairs:
    backend: text_tokenizer
    max_batch_size: 8
    inputs:
      - {name: LEFT, dtype: string, shape: [batch, 1]}
      - {name: RIGHT, dtype: string, shape: [batch, 1]}
    outputs:
      - {name: input_ids, dtype: int64, shape: [batch, sequence]}
    parameters: {tokenizer_file: tokenizer.json, max_length: 32}
    files: {tokenizer.json: words/tokenizer.json}
  photo_prep:
    backend: image_preprocess
    max_batch_size: 4
    inputs:
      - {name: PICTURE, dtype: string, shape: [batch, 1]}
    outputs:
      - {name: pixel_values, dtype: float32, shape: [batch, 3, 224, 224]}
    parameters: {image_size: 224, resize_shorter: 256}
pipelines:
  search:
    max_batch_size: 8
    inputs:
      - {name: QUERY, dtype: string, shape: [batch, 1]}
    outputs:
      - {name: VECTOR, dtype: float32, shape: [batch, 4]}
    steps:
      - model: words
        inputs: {QUERY: QUERY}
        outputs: {input_ids: ids, attention_mask: mask}
      - model: piped
        inputs: {input_ids: ids, attention_mask: mask}
        outputs: {embedding: VECTOR}
"""


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("scenario_spec")
    path = start_spec(root)
    save_tokenizer(root / "ids")  # beside ids.onnx
    save_tokenizer(root / "words")  # the `words` tokenizer's file, nothing beside piped.onnx
    add_model("onnx", str(ids_onnx(root / "ids" / "ids.onnx", VOCABULARY)), "ids_enc", path)
    add_model("onnx", str(ids_onnx(root / "plain" / "plain.onnx", VOCABULARY)), "plain", path)
    add_model("onnx", str(ids_onnx(root / "piped" / "piped.onnx", VOCABULARY, axis="sequence")),
              "piped", path)
    add_model("onnx", str(linear_onnx(root / "lin" / "lin.onnx")), "lin", path)
    path.write_text(path.read_text() + _ENTRIES)
    return load_spec(path)


def _lengths(scenario, name: str) -> set[int]:
    return {r.inputs[name].shape[1] for r in scenario.requests}


def test_every_pipeline_and_model_of_the_spec_is_a_scenario(spec):
    assert scenario_names(spec) == ["search", "ids_enc", "plain", "piped", "lin", "words", "pairs",
                                    "photo_prep"]


def test_an_unknown_scenario_names_the_known_ones(spec):
    with pytest.raises(UnknownScenario, match=r"--scenario nope: not a pipeline or model of .*"
                                              r"\(known: search, ids_enc, plain, "):
        build_scenario(spec, "nope")


def test_a_string_input_read_by_a_tokenizer_is_sent_as_the_shipped_texts(spec):
    scenario = build_scenario(spec, "search")
    texts = load_texts(paths.TEXTS_FILE)
    assert [s.kind for s in scenario.sources] == [InputKind.TEXT]
    assert len(scenario.requests) == len(texts)
    first = scenario.requests[0]
    assert (first.model, scenario.labels[0], first.outputs) == ("search", "text-0", ("VECTOR",))
    assert first.inputs["QUERY"].shape == (1, 1)
    assert first.inputs["QUERY"][0, 0] == texts[0].encode("utf-8")
    assert "backend text_tokenizer of words" in scenario.describe()[0]


def test_a_string_input_read_by_an_image_step_is_sent_as_the_shipped_photos(spec):
    scenario = build_scenario(spec, "photo_prep")
    images = load_images(paths.IMAGES_DIR)
    assert [s.kind for s in scenario.sources] == [InputKind.IMAGE]
    assert list(scenario.labels) == [name for name, _ in images]
    assert scenario.requests[0].inputs["PICTURE"][0, 0] == images[0][1]


def test_two_text_inputs_are_sent_as_pairs_of_texts(spec):
    scenario = build_scenario(spec, "pairs")
    texts = load_texts(paths.TEXTS_FILE)
    assert [s.kind for s in scenario.sources] == [InputKind.TEXT, InputKind.TEXT]
    second = scenario.requests[1]
    assert scenario.labels[1] == "pair-1"
    assert (second.inputs["LEFT"][0, 0], second.inputs["RIGHT"][0, 0]) == (
        texts[1].encode(), texts[2].encode())
    assert "consecutive lines as pairs" in scenario.describe()[0]


def test_raw_tensors_are_generated_within_the_axis_and_the_vocabulary_beside_the_file(spec):
    scenario = build_scenario(spec, "ids_enc")
    axis = spec.find("ids_enc").axis("tokens")
    high = min(axis.max, OPT_FACTOR * axis.opt)
    assert all(s.kind is InputKind.TENSOR for s in scenario.sources)
    lengths = _lengths(scenario, "input_ids")
    assert min(lengths) >= axis.min and max(lengths) <= high and len(lengths) > 10
    for request in scenario.requests:
        ids, mask = request.inputs["input_ids"], request.inputs["attention_mask"]
        assert ids.dtype == np.int64 and ids.shape == mask.shape and ids.shape[0] == 1
        assert 0 <= ids.min() and ids.max() < VOCABULARY
        assert (mask == 1).all()
    described = scenario.describe()[0]
    assert f"token ids in [0, {VOCABULARY})" in described
    assert str(Path(spec.path).parent / "ids" / "tokenizer.json") in described


def test_ids_of_a_model_fed_by_a_tokenizer_take_that_tokenizers_vocabulary(spec):
    scenario = build_scenario(spec, "piped")
    assert f"token ids in [0, {VOCABULARY})" in scenario.describe()[0]
    assert str(Path(spec.path).parent / "words" / "tokenizer.json") in scenario.describe()[0]


def test_ids_with_no_tokenizer_in_sight_stay_under_the_safe_bound_and_say_so(spec):
    scenario = build_scenario(spec, "plain")
    assert max(int(r.inputs["input_ids"].max()) for r in scenario.requests) < SAFE_VOCABULARY
    assert "no tokenizer found for plain" in scenario.describe()[0]


def test_a_float_input_is_generated_with_its_fixed_dims(spec):
    scenario = build_scenario(spec, "lin")
    assert {r.inputs["features"].shape for r in scenario.requests} == {(1, 6)}
    assert scenario.requests[0].inputs["features"].dtype == np.float32
    assert scenario.output_names == ("scores",)


def test_generated_load_is_the_same_on_every_build(spec):
    assert build_scenario(spec, "ids_enc").digest == build_scenario(spec, "ids_enc").digest
    assert build_scenario(spec, "ids_enc").digest != build_scenario(spec, "plain").digest


# --------------------------------------------------------------------------- --data


def _lines(tmp_path: Path, *rows, name: str = "data.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_json_lines_become_one_request_each_with_the_batch_axis_added(spec, tmp_path):
    data = _lines(tmp_path, {"input_ids": [2, 5, 7], "attention_mask": [1, 1, 1]}, "",
                  {"input_ids": [[4, 4], [5, 5]], "attention_mask": [[1, 1], [1, 0]]})
    scenario = build_scenario(spec, "ids_enc", data)
    assert list(scenario.labels) == ["line-1", "line-3"]
    first, second = scenario.requests
    assert first.inputs["input_ids"].tolist() == [[2, 5, 7]]
    assert second.inputs["attention_mask"].shape == (2, 2)
    assert second.inputs["input_ids"].shape == (2, 2)  # batch of two, as the line gave it
    assert first.inputs["input_ids"].dtype == np.int64
    assert build_scenario(spec, "ids_enc", data).digest != build_scenario(spec, "ids_enc").digest


def test_json_lines_of_strings_feed_text_and_image_inputs(spec, tmp_path):
    text = build_scenario(spec, "search", _lines(tmp_path, {"QUERY": "cheap flights"}))
    assert text.requests[0].inputs["QUERY"].tolist() == [[b"cheap flights"]]
    image = next(paths.IMAGES_DIR.iterdir())
    photos = build_scenario(spec, "photo_prep", _lines(tmp_path, {"PICTURE": str(image)},
                                                      name="photos.jsonl"))
    assert photos.requests[0].inputs["PICTURE"][0, 0] == image.read_bytes()


@pytest.mark.parametrize(("row", "message"), [
    ("{not json", r":1: not JSON"),
    ("[1, 2]", r":1: expected a JSON object of input name -> value, got list"),
    ({"input_ids": [1], "attention_mask": [1], "extra": [1]},
     r":1: input 'extra' is not an input of ids_enc \(inputs: input_ids, attention_mask\)"),
    ({"input_ids": [1, 2]}, r":1: input 'attention_mask' is missing"),
    ({"input_ids": [[[1]]], "attention_mask": [1]}, r":1: input 'input_ids': 3 dims, expected 1"),
    ({"input_ids": ["a", "b"], "attention_mask": [1, 1]},
     r":1: input 'input_ids': expected numbers, got strings"),
    ({"input_ids": [1.5, 2], "attention_mask": [1, 1]},
     r":1: input 'input_ids': expected integers \(int64\), got fractions"),
    ({"input_ids": [[1, 2], [3]], "attention_mask": [1, 1]},
     r":1: input 'input_ids': nested lists of unequal lengths"),
    ({"input_ids": list(range(300)), "attention_mask": [1] * 300},
     r":1: input 'input_ids': axis 'tokens' is 300, outside 1..256"),
    ({"input_ids": [1, 2, 3], "attention_mask": [1, 1]},
     r":1: input 'attention_mask' has axis 'tokens' of 2, but input 'input_ids' has 3"),
    ({"input_ids": [[1]] * 17, "attention_mask": [[1]] * 17},
     r":1: batch of 17 rows, the model takes 1..16"),
])
def test_a_data_line_that_does_not_fit_names_the_line_and_the_input(spec, tmp_path, row, message):
    data = _lines(tmp_path, row)
    with pytest.raises(DataError, match=rf"^{tmp_path / 'data.jsonl'}{message}"):
        build_scenario(spec, "ids_enc", data)


def test_a_wrong_fixed_dim_and_a_missing_image_file_are_named(spec, tmp_path):
    with pytest.raises(DataError, match=r":2: input 'features': dim 1 is 5, expected 6"):
        build_scenario(spec, "lin", _lines(tmp_path, {"features": [0.0] * 6},
                                           {"features": [0.0] * 5}))
    with pytest.raises(DataError, match=r":1: input 'PICTURE': image file 'gone.jpg' not found"):
        build_scenario(spec, "photo_prep", _lines(tmp_path, {"PICTURE": "gone.jpg"}))


def test_a_text_file_feeds_texts_and_tab_separated_pairs(spec, tmp_path):
    texts = tmp_path / "mine.txt"
    texts.write_text("first query\n\nsecond query\n")
    scenario = build_scenario(spec, "search", texts)
    assert [r.inputs["QUERY"][0, 0] for r in scenario.requests] == [b"first query",
                                                                   b"second query"]
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("what is a cat\ta cat is a small animal\nhow far is the moon\tfar\n")
    rows = build_scenario(spec, "pairs", pairs).requests
    assert rows[1].inputs["RIGHT"][0, 0] == b"far"
    pairs.write_text("what is a cat\ta cat is a small animal\nno tab here\n")
    with pytest.raises(DataError, match=r"pairs.txt:2: 1 tab-separated text\(s\), expected 2 "
                                        r"\(LEFT, RIGHT\)"):
        build_scenario(spec, "pairs", pairs)


def test_data_of_the_wrong_kind_for_the_inputs_is_refused(spec, tmp_path):
    texts = tmp_path / "mine.txt"
    texts.write_text("a text\n")
    with pytest.raises(DataError, match=r"lines of text feed text inputs; lin takes features "
                                        r"\(float32\): give JSON lines"):
        build_scenario(spec, "lin", texts)
    with pytest.raises(DataError, match=r"a folder gives images; search takes QUERY \(string\)"):
        build_scenario(spec, "search", tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"no .jpg/.jpeg/.png file in it"):
        build_scenario(spec, "photo_prep", tmp_path / "empty")


def test_a_folder_of_images_replaces_the_shipped_photos(spec, tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    image = sorted(paths.IMAGES_DIR.iterdir())[3]
    (folder / "mine.jpg").write_bytes(image.read_bytes())
    (folder / "notes.txt").write_text("not an image")
    scenario = build_scenario(spec, "photo_prep", folder)
    assert list(scenario.labels) == ["mine.jpg"]


# --------------------------------------------------------------------------- the answer check


def test_the_check_names_a_missing_output_a_wrong_shape_dtype_or_nan(spec):
    scenario = build_scenario(spec, "ids_enc")
    request = scenario.requests[0]
    good = np.zeros((1, 4), np.float32)
    assert scenario.check(request, {"embedding": good}) is None
    assert scenario.check(request, {}) == "embedding is missing from the response"
    assert scenario.check(request, {"embedding": np.zeros((1, 5), np.float32)}) == (
        "embedding has shape (1, 5), expected (1, 4)")
    assert scenario.check(request, {"embedding": good.astype(np.float64)}) == (
        "embedding is float64, expected float32")
    assert scenario.check(request, {"embedding": np.full((1, 4), np.nan, np.float32)}) == (
        "embedding holds NaN")


# --------------------------------------------------------------------------- shipped examples


def test_the_shipped_pipelines_keep_their_payloads():
    shipped = load_spec(paths.SPEC_FILE)
    texts = build_scenario(shipped, "text_embedding")
    assert list(texts.labels) == [f"text-{i}" for i in range(len(texts.requests))]
    assert [r.inputs["TEXT"][0, 0].decode() for r in texts.requests] == load_texts(
        paths.TEXTS_FILE)
    assert texts.output_names == ("EMBEDDING",)
    images = build_scenario(shipped, "image_classification")
    sent = [(label, r.inputs["IMAGE"][0, 0]) for label, r in zip(images.labels, images.requests)]
    assert sent == load_images(paths.IMAGES_DIR)
    assert images.output_names == ("CLASS_INDEX", "SCORE", "LABEL")
