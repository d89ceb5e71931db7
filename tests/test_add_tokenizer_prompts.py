"""``tools add hf-text-embedding`` on the folders users meet: a ``vocab.txt``-only tokenizer, and
sentence-transformers ``prompts``.

The vocabulary-only folder is all-MiniLM-L6-v2's files minus ``tokenizer.json``: transformers
converts it at build time into the tokenizer model's version folder (the user's folder stays as
it was), it tokenizes the shipped texts exactly as the original ``tokenizer.json``, and the served
pipeline matches sentence-transformers on the original folder. The prompt folder is MiniLM with
``prompts`` and ``default_prompt_name`` in its ``config_sentence_transformers.json``: served
embeddings equal ``SentenceTransformer.encode(text)`` with that prompt.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.add_helpers import (PROTOCOLS, TEXTS, copy_minilm, infer, listing, minilm, prompt_folder,
                               text_batch)
from tools.add.command import add_model

pytestmark = [pytest.mark.torch, pytest.mark.timeout(1500)]
REPO_ROOT = Path(__file__).resolve().parents[1]
SHIPPED_TEXTS = REPO_ROOT / "loadtests" / "data" / "texts.txt"


def _shipped_texts() -> list[str]:
    return [line for line in SHIPPED_TEXTS.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_a_vocabulary_only_folder_tokenizes_the_shipped_texts_as_the_original(tmp_path):
    from tokenizers import Tokenizer

    from tools.models.hf_folder import read_folder

    folder = read_folder(copy_minilm(tmp_path / "vocab", ("tokenizer.json",)), "hf-text-embedding")
    assert not folder.has_tokenizer_json
    converted, original = folder.fast_tokenizer(), Tokenizer.from_file(str(minilm() / "tokenizer.json"))
    for tokenizer in (converted, original):
        tokenizer.no_padding()
        tokenizer.no_truncation()
    texts = _shipped_texts()
    assert len(texts) > 100
    assert [e.ids for e in converted.encode_batch(texts)] == [e.ids for e in original.encode_batch(texts)]
    pairs = list(zip(texts[:50], texts[50:100]))
    assert ([e.type_ids for e in converted.encode_batch(pairs)]
            == [e.type_ids for e in original.encode_batch(pairs)])


def test_the_conversion_is_part_of_the_tokenizer_build_key(tmp_path):
    from tools.build_repo.model_source import python_recipe_inputs
    from tools.build_repo.spec import load_spec

    folder = copy_minilm(tmp_path / "vocab", ("tokenizer.json",))
    spec_path = tmp_path / "repository.yaml"
    add_model("hf-text-embedding", str(folder), "voc", spec_path)
    spec = load_spec(spec_path)
    tokenizer = spec.find("voc_tokenizer")
    assert tokenizer.recipe.kind == "hf-tokenizer" and "tokenizer.json" not in tokenizer.files
    before = python_recipe_inputs(spec.root, tokenizer)
    assert {Path(p).name for p in before["files"]} >= {"vocab.txt", "tokenizer_config.json"}
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "do_lower_case": False}))
    assert python_recipe_inputs(spec.root, tokenizer) != before


def test_prompt_options_write_the_prompt_sentence_transformers_would_use(tmp_path):
    from tools.build_repo.spec import load_spec
    from tools.errors import UserInputError

    folder = prompt_folder(tmp_path / "prompted")
    spec_path = tmp_path / "repository.yaml"
    add_model("hf-text-embedding", str(folder), "default", spec_path)
    add_model("hf-text-embedding", str(folder), "named", spec_path, prompt_name="passage")
    add_model("hf-text-embedding", str(folder), "given", spec_path, prompt="search: ")
    add_model("hf-text-embedding", str(folder), "none", spec_path, prompt="")
    spec = load_spec(spec_path)
    prompts = {n: dict(spec.find(f"{n}_tokenizer").parameters).get("prompt")
               for n in ("default", "named", "given", "none")}
    assert prompts == {"default": "query: ", "named": "passage: ", "given": "search: ", "none": None}
    before = spec_path.read_text()
    with pytest.raises(UserInputError, match=r"--prompt-name 'title': .* has prompts \['passage', 'query'\]"):
        add_model("hf-text-embedding", str(folder), "bad", spec_path, prompt_name="title")
    assert spec_path.read_text() == before


@pytest.fixture(scope="module")
def served(added_models):
    """The vocabulary-only folder (``voc``) and the prompt folder (``query``) in the session's
    repository of every recipe (one spec, one server)."""
    return {"repository": added_models.repository, "vocab": added_models.sources["voc"],
            "prompted": added_models.sources["query"], "listing": added_models.listings["voc"],
            "server": added_models.server}


@pytest.mark.server
def test_the_converted_tokenizer_is_written_into_the_build_never_into_the_folder(served):
    from tokenizers import Tokenizer

    built = served["repository"] / "voc_tokenizer" / "1" / "tokenizer.json"
    assert built.is_file()
    assert not (served["vocab"] / "tokenizer.json").exists()
    assert listing(served["vocab"]) == served["listing"]
    original = Tokenizer.from_file(str(minilm() / "tokenizer.json"))
    loaded = Tokenizer.from_file(str(built))
    texts = _shipped_texts()
    for tokenizer in (original, loaded):
        tokenizer.no_padding()
        tokenizer.no_truncation()
    assert [e.ids for e in loaded.encode_batch(texts)] == [e.ids for e in original.encode_batch(texts)]


@pytest.mark.server
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_vocabulary_only_pipeline_matches_sentence_transformers(served, protocol):
    from sentence_transformers import SentenceTransformer

    texts = [*TEXTS, "Hello!", *_shipped_texts()[:8], "Stock markets fell sharply. " * 80]
    embeddings = infer(served["server"], protocol, "voc", "TEXT", text_batch(texts),
                       ["EMBEDDING"])["EMBEDDING"]
    reference = SentenceTransformer(str(minilm()), device="cpu").encode(texts)
    difference = float(np.abs(embeddings - reference).max())
    print(f"vocab.txt-only recipe vs sentence-transformers over {protocol}: max abs {difference:.2e}")
    assert difference <= 1e-4


@pytest.mark.server
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_default_prompt_is_prepended_like_sentence_transformers_encode(served, protocol):
    from sentence_transformers import SentenceTransformer

    texts = [*TEXTS, "Hello!", "Stock markets fell sharply. " * 80]
    embeddings = infer(served["server"], protocol, "query", "TEXT", text_batch(texts),
                       ["EMBEDDING"])["EMBEDDING"]
    model = SentenceTransformer(str(served["prompted"]), device="cpu")
    reference = model.encode(texts)  # default_prompt_name: "query: "
    difference = float(np.abs(embeddings - reference).max())
    print(f"prompted recipe vs SentenceTransformer.encode over {protocol}: max abs {difference:.2e}")
    assert difference <= 1e-4
    np.testing.assert_allclose(reference, model.encode(texts, prompt="query: "), atol=1e-6)
    assert float(np.abs(embeddings - model.encode(texts, prompt="")).max()) > 1e-2
