"""tools tune's knob space: ladders, the cores rule, moves and start overrides.

No server and no build: plain data.
"""

from __future__ import annotations

import pytest

from tools.errors import UserInputError
from tools.tune.knobs import (
    Coordinate,
    KnobSpace,
    ModelKnobs,
    settings_from_dict,
    settings_key,
    settings_to_dict,
    with_overrides,
)

ENCODER = ModelKnobs(1, 2, 2000, (), 128)
TOKENIZER = ModelKnobs(1, None, 500, (), 128)


def _space(cores: int = 2, **start: ModelKnobs) -> KnobSpace:
    start = start or {"text_tokenizer": TOKENIZER, "minilm_encoder": ENCODER}
    return KnobSpace(cores, {name: 32 for name in start}, dict(start))


def test_more_instances_than_the_cores_allow_lowers_the_threads_to_fit():
    space = _space()
    moved = space.step(space.start, Coordinate("minilm_encoder", "instances"), +1)
    assert moved["minilm_encoder"].instances == 2
    assert moved["minilm_encoder"].threads == 1


def test_more_threads_than_the_cores_allow_lowers_the_instances_to_fit():
    space = _space(minilm_encoder=ModelKnobs(2, 1, 2000, (), 128))
    moved = space.step(space.start, Coordinate("minilm_encoder", "threads"), +1)
    assert (moved["minilm_encoder"].instances, moved["minilm_encoder"].threads) == (1, 2)


def test_threads_beyond_the_cores_are_not_a_move():
    space = _space(minilm_encoder=ModelKnobs(1, 2, 2000, (), 128))
    assert space.step(space.start, Coordinate("minilm_encoder", "threads"), +1) is None


def test_a_step_past_the_end_of_a_ladder_is_not_a_move():
    space = _space(minilm_encoder=ModelKnobs(1, 1, 0, (), 128))
    assert space.step(space.start, Coordinate("minilm_encoder", "max_queue_delay_microseconds"),
                      -1) is None


def test_a_start_value_off_the_ladder_joins_it_in_order():
    space = _space(minilm_encoder=ModelKnobs(1, 2, 1500, (), 100))
    assert space.values("minilm_encoder", "max_queue_delay_microseconds") == [
        0, 500, 1000, 1500, 2000, 4000, 8000]
    assert 100 in space.values("minilm_encoder", "max_queue_size")


def test_preferred_sizes_above_max_batch_size_are_left_out():
    space = KnobSpace(2, {"enc": 8}, {"enc": ENCODER})
    assert space.values("enc", "preferred_batch_size") == [(), (2,), (4,), (8,)]


def test_coordinates_put_onnx_runtime_models_first_and_skip_a_model_without_batcher():
    no_batcher = ModelKnobs(1, None, None, (), None)
    space = _space(text_tokenizer=no_batcher, minilm_encoder=ENCODER)
    names = [str(c) for c in space.coordinates()]
    assert names[:3] == ["minilm_encoder.instances", "text_tokenizer.instances",
                         "minilm_encoder.threads"]
    assert "text_tokenizer.max_queue_delay_microseconds" not in names


def test_a_single_core_leaves_no_instance_or_thread_knob():
    space = _space(cores=1, minilm_encoder=ModelKnobs(1, 1, 2000, (), 128))
    names = [str(c) for c in space.coordinates()]
    assert "minilm_encoder.instances" not in names and "minilm_encoder.threads" not in names


def test_start_overrides_set_knobs_by_model_and_name():
    start = {"text_tokenizer": TOKENIZER, "minilm_encoder": ENCODER}
    out = with_overrides(start, ["minilm_encoder.intra_op_threads=1",
                                 "minilm_encoder.max_queue_delay_microseconds=0",
                                 "text_tokenizer.preferred_batch_size=4/8"], cpu_cores=2)
    assert out["minilm_encoder"] == ModelKnobs(1, 1, 0, (), 128)
    assert out["text_tokenizer"].preferred_batch_size == (4, 8)


@pytest.mark.parametrize("override, words", [
    ("nope.instances=1", "not a model of the pipeline"),
    ("minilm_encoder.colour=1", "unknown knob"),
    ("text_tokenizer.threads=2", "has no threads"),
    ("minilm_encoder.instances=two", "not an integer"),
    ("minilm_encoder.instances=2", "over cpu_cores 2"),
    ("minilm_encoder", "MODEL.KNOB=VALUE"),
])
def test_start_overrides_refuse_bad_input_naming_the_problem(override, words):
    start = {"text_tokenizer": TOKENIZER, "minilm_encoder": ENCODER}
    with pytest.raises(UserInputError, match=words):
        with_overrides(start, [override], cpu_cores=2)


def test_settings_survive_the_json_round_trip_with_the_same_key():
    settings = {"minilm_encoder": ModelKnobs(2, 1, 4000, (8,), 64), "text_tokenizer": TOKENIZER}
    back = settings_from_dict(settings_to_dict(settings))
    assert back == settings
    assert settings_key(back) == settings_key(dict(reversed(list(settings.items()))))
