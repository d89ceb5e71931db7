"""Unit tests of the image pre- and postprocessing functions behind the Python-backend models.

No server and no torch: decoding, geometry, normalisation, top-k and every bad-image case.
"""

from __future__ import annotations

import io
import pathlib

import numpy as np
import pytest
from PIL import Image, ImageFile
from pipeline_ops import image, topk
from pipeline_ops.batching import InvalidInput
from pipeline_ops.errors import ConfigurationError

IMAGES = pathlib.Path(__file__).parent / "data" / "images"
LABELS = (
    pathlib.Path(__file__).parents[1] / "backends" / "python" / "image_postprocess" / "labels.txt"
)
SETTINGS = image.PreprocessSettings()


def encode(picture: Image.Image, fmt: str = "PNG", **options) -> bytes:
    """Encode a Pillow image to bytes."""
    buffer = io.BytesIO()
    picture.save(buffer, fmt, **options)
    return buffer.getvalue()


def image_tensor(*items: bytes) -> np.ndarray:
    """A ``[rows, 1]`` BYTES tensor as the Python backend hands it to ``execute``."""
    return np.array([[item] for item in items], dtype=np.object_).reshape(len(items), 1)


def solid(colour, size=(320, 240), mode="RGB") -> bytes:
    """A PNG of one colour."""
    return encode(Image.new(mode, size, colour))


# --- decoding, geometry, values -------------------------------------------------------------------


def test_preprocess_returns_chw_float32_of_image_size_when_image_is_valid():
    pixels = image.preprocess((IMAGES / "chelsea_small.jpg").read_bytes(), SETTINGS)
    assert pixels.shape == (3, 224, 224)
    assert pixels.dtype == np.float32
    assert pixels.flags["C_CONTIGUOUS"]
    assert -1.0 <= pixels.min() < pixels.max() <= 1.0


@pytest.mark.parametrize(
    ("colour", "expected"),
    [
        ((0, 0, 0), (-1, -1, -1)),
        ((255, 255, 255), (1, 1, 1)),
        ((255, 0, 0), (1, -1, -1)),
        ((0, 0, 255), (-1, -1, 1)),
    ],
)
def test_normalise_scales_to_minus_one_one_with_rgb_channels_first_when_colour_is_solid(
    colour, expected
):
    pixels = image.preprocess(solid(colour), SETTINGS)
    for channel, value in enumerate(expected):
        np.testing.assert_allclose(pixels[channel], value, atol=1e-6)


def test_normalise_maps_mid_grey_to_about_zero_when_value_is_128():
    pixels = image.preprocess(solid((128, 128, 128)), SETTINGS)
    np.testing.assert_allclose(pixels, (128 - 127.5) / 127.5, atol=1e-6)


def test_resize_and_crop_keeps_only_the_centre_when_image_is_wide():
    # 1024 x 512: shorter side -> 256 gives 512 x 256; the centre 224 columns are 144..368 of 512,
    # i.e. 288..736 of the source. White there, black outside a margin beyond the crop.
    source = np.zeros((512, 1024, 3), np.uint8)
    source[:, 260:764] = 255
    cropped = image.resize_and_crop(Image.fromarray(source), 256, 224)
    assert cropped.size == (224, 224)
    assert np.asarray(cropped).min() == 255


def test_resize_and_crop_includes_the_edges_of_the_centre_square_when_image_is_wide():
    # Black stripes just inside the crop (source columns 288..300 and 724..736) must survive.
    source = np.full((512, 1024, 3), 255, np.uint8)
    source[:, 288:300] = 0
    source[:, 724:736] = 0
    cropped = np.asarray(image.resize_and_crop(Image.fromarray(source), 256, 224))
    assert cropped[:, 0].max() < 64 and cropped[:, -1].max() < 64
    assert cropped[:, 112].min() == 255


@pytest.mark.parametrize(
    "size", [(2000, 300), (300, 2000), (1, 5000), (5000, 1), (225, 224), (64, 48)]
)
def test_preprocess_returns_image_size_square_when_aspect_ratio_is_extreme(size):
    assert image.preprocess(solid((10, 20, 30), size=size), SETTINGS).shape == (3, 224, 224)


def test_preprocess_honours_parameters_when_sizes_are_configured():
    settings = image.PreprocessSettings(image_size=160, resize_shorter=182, max_pixels=10_000_000)
    assert image.preprocess(solid((1, 2, 3)), settings).shape == (3, 160, 160)


def test_decode_applies_exif_orientation_when_tag_says_rotate():
    decoded = image.decode((IMAGES / "coffee_exif_rotated.jpg").read_bytes(), SETTINGS.max_pixels)
    stored = Image.open(IMAGES / "coffee_exif_rotated.jpg")
    assert stored.size == (200, 300)
    assert decoded.size == (300, 200)


def test_decode_uses_reduced_jpeg_scale_but_keeps_shorter_side_when_jpeg_is_large():
    big = encode(Image.new("RGB", (2400, 1800), (90, 120, 150)), "JPEG", quality=90)
    decoded = image.decode(big, SETTINGS.max_pixels, min_side=256)
    assert min(decoded.size) >= 256
    assert decoded.size[0] < 2400  # decoded at a reduced DCT scale, not at full size
    np.testing.assert_allclose(
        image.preprocess(big, SETTINGS),
        image.normalise(Image.new("RGB", (224, 224), (90, 120, 150))),
        atol=3 / 127.5,
    )


def test_jpeg_draft_off_decodes_a_large_jpeg_at_full_scale():
    picture = Image.fromarray(np.random.default_rng(2).integers(0, 255, (1800, 2400, 3), np.uint8))
    big = encode(picture, "JPEG", quality=90)
    off = image.PreprocessSettings.from_parameters({"jpeg_draft": "false"}, "image_preprocess")
    assert off.jpeg_draft is False and SETTINGS.jpeg_draft is True
    full = image.resize_and_crop(image.decode(big, SETTINGS.max_pixels), 256, 224)
    np.testing.assert_array_equal(image.preprocess(big, off), image.normalise(full))
    # with draft (the default) the same image is decoded at half scale: close, not identical
    drafted = image.preprocess(big, SETTINGS)
    assert not np.array_equal(drafted, image.preprocess(big, off))


# --- channel handling: everything becomes RGB -----------------------------------------------------


def test_grey_is_replicated_to_three_equal_channels_when_image_is_mode_l():
    pixels = image.preprocess((IMAGES / "chelsea_grey.png").read_bytes(), SETTINGS)
    np.testing.assert_array_equal(pixels[0], pixels[1])
    np.testing.assert_array_equal(pixels[0], pixels[2])


def test_sixteen_bit_grey_is_scaled_not_clipped_when_png_has_16_bit_depth():
    values = np.array([[0, 257 * 64, 257 * 128, 65535]], dtype=np.uint16)
    decoded = image.decode(encode(Image.fromarray(values)), SETTINGS.max_pixels)
    np.testing.assert_array_equal(np.asarray(decoded)[0, :, 0], [0, 64, 128, 255])


def test_sixteen_bit_grey_file_matches_its_eight_bit_source_when_decoded():
    from_16 = image.preprocess((IMAGES / "coffee_grey16.png").read_bytes(), SETTINGS)
    assert from_16.shape == (3, 224, 224)
    assert from_16.std() > 0.1  # not saturated to white, as Pillow's clipping conversion would be


def test_alpha_is_composited_over_white_when_image_is_rgba():
    picture = Image.new("RGBA", (300, 300), (0, 0, 0, 0))  # fully transparent black
    np.testing.assert_allclose(image.preprocess(encode(picture), SETTINGS), 1.0)
    half = Image.new("RGBA", (300, 300), (0, 0, 0, 128))
    np.testing.assert_allclose(
        image.preprocess(encode(half), SETTINGS), (127 - 127.5) / 127.5, atol=2 / 127.5
    )


def test_transparent_band_turns_white_when_rgba_file_is_decoded():
    decoded = np.asarray(
        image.decode((IMAGES / "coffee_rgba.png").read_bytes(), SETTINGS.max_pixels)
    )
    assert decoded.shape == (200, 300, 3)
    assert decoded[:, :60].min() == 255
    assert decoded[:, 60:].min() < 255


def test_cmyk_jpeg_converts_to_rgb_close_to_its_source_when_decoded():
    assert Image.open(IMAGES / "chelsea_cmyk.jpg").mode == "CMYK"
    from_cmyk = image.preprocess((IMAGES / "chelsea_cmyk.jpg").read_bytes(), SETTINGS)
    from_rgb = image.preprocess((IMAGES / "chelsea_small.jpg").read_bytes(), SETTINGS)
    assert np.abs(from_cmyk - from_rgb).mean() < 0.05  # two lossy encodings of the same picture


def test_palette_png_matches_rgb_when_palette_is_expanded():
    picture = Image.new("RGB", (300, 200), (200, 30, 60))
    as_palette = picture.convert("P", palette=Image.Palette.ADAPTIVE)
    np.testing.assert_allclose(
        image.preprocess(encode(as_palette), SETTINGS), image.preprocess(encode(picture), SETTINGS)
    )


def test_palette_transparency_is_composited_when_palette_has_transparent_index():
    picture = Image.new("P", (300, 200), 0)
    picture.putpalette([0, 0, 0] * 256)
    np.testing.assert_allclose(image.preprocess(encode(picture, transparency=0), SETTINGS), 1.0)


# --- bad images -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("not_an_image.bin", "not a decodable JPEG or PNG image"),
        ("truncated.jpg", "truncated JPEG data"),
        ("zero_size.png", "zero-size image (declared 0x0)"),
        ("bomb_header.png", "declared image size 100000x100000"),
        (
            "bomb_64mpx.png",
            "declared image size 8000x8000 (64000000 pixels) exceeds max_pixels=40000000",
        ),
    ],
)
def test_preprocess_raises_invalid_input_naming_image_and_problem_when_file_is_bad(name, problem):
    with pytest.raises(InvalidInput) as caught:
        image.preprocess((IMAGES / name).read_bytes(), SETTINGS, row=3)
    assert "input 'IMAGE' row 3" in str(caught.value)
    assert problem in str(caught.value)


def test_preprocess_raises_invalid_input_when_bytes_are_empty():
    with pytest.raises(InvalidInput, match=r"input 'IMAGE': the image is empty \(0 bytes\)"):
        image.preprocess(b"", SETTINGS)


def test_preprocess_rejects_truncated_jpeg_at_every_cut_when_data_ends_early():
    data = (IMAGES / "chelsea_small.jpg").read_bytes()
    for cut in (2, 100, 400, len(data) // 3, len(data) - 300, len(data) - 2):
        with pytest.raises(InvalidInput, match="input 'IMAGE'"):
            image.preprocess(data[:cut], SETTINGS)


def test_oversized_image_is_rejected_before_any_pixel_is_decoded(monkeypatch):
    def refuse(self):
        raise AssertionError("pixels were decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", refuse)
    with pytest.raises(InvalidInput, match="exceeds max_pixels=40000000; rejected before decoding"):
        image.preprocess((IMAGES / "bomb_64mpx.png").read_bytes(), SETTINGS)


def test_image_is_rejected_when_it_is_just_above_max_pixels():
    data = solid((5, 5, 5), size=(101, 100))
    with pytest.raises(InvalidInput, match=r"10100 pixels\) exceeds max_pixels=10000"):
        image.decode(data, max_pixels=10_000)
    assert image.decode(data, max_pixels=10_100).size == (101, 100)


@pytest.mark.parametrize("fmt", ["GIF", "BMP", "TIFF"])
def test_preprocess_rejects_other_formats_when_pillow_could_read_them(fmt):
    with pytest.raises(InvalidInput, match="not a decodable JPEG or PNG image"):
        image.preprocess(encode(Image.new("RGB", (64, 64)), fmt), SETTINGS)


def test_declared_size_reads_jpeg_and_png_headers_when_present():
    assert image.declared_size((IMAGES / "chelsea_small.jpg").read_bytes()) == (300, 200)
    assert image.declared_size((IMAGES / "bomb_header.png").read_bytes()) == (100_000, 100_000)
    assert image.declared_size(b"plain text") is None


# --- request validation and batching --------------------------------------------------------------


def test_prepare_request_raises_when_dtype_is_not_bytes():
    with pytest.raises(InvalidInput, match="input 'IMAGE': expected BYTES .* got dtype float32"):
        image.prepare_request({"IMAGE": np.zeros((1, 1), np.float32)}, SETTINGS)


@pytest.mark.parametrize("shape", [(2,), (1, 1, 1), (1, 2)])
def test_prepare_request_raises_when_rank_or_shape_is_wrong(shape):
    tensor = np.full(shape, solid((1, 1, 1)), dtype=np.object_)
    with pytest.raises(InvalidInput, match=r"input 'IMAGE': expected shape \[batch, 1\]"):
        image.prepare_request({"IMAGE": tensor}, SETTINGS)


def test_prepare_request_raises_when_input_is_missing():
    with pytest.raises(InvalidInput, match="input 'IMAGE': missing"):
        image.prepare_request({"IMAGE": None}, SETTINGS)


def test_prepare_request_names_the_row_when_one_element_is_not_bytes():
    tensor = np.array([[solid((1, 1, 1))], ["text"]], dtype=np.object_)
    with pytest.raises(
        InvalidInput, match="input 'IMAGE' row 1: expected encoded image bytes, got str"
    ):
        image.prepare_request({"IMAGE": tensor}, SETTINGS)


def test_preprocess_requests_fails_only_the_bad_request_when_batch_mixes_good_and_bad():
    cat = (IMAGES / "chelsea_small.jpg").read_bytes()
    grey = (IMAGES / "chelsea_grey.png").read_bytes()
    requests = [
        {"IMAGE": image_tensor(cat, grey)},
        {"IMAGE": image_tensor((IMAGES / "truncated.jpg").read_bytes())},
        {"IMAGE": image_tensor(grey)},
        {"IMAGE": np.empty((0, 1), np.object_)},
    ]
    results = image.preprocess_requests(requests, SETTINGS)
    assert [type(r).__name__ for r in results] == ["dict", "InvalidInput", "dict", "InvalidInput"]
    assert "truncated JPEG" in str(results[1])
    assert "empty batch" in str(results[3])
    assert results[0]["pixel_values"].shape == (2, 3, 224, 224)
    np.testing.assert_array_equal(results[0]["pixel_values"][0], image.preprocess(cat, SETTINGS))
    np.testing.assert_array_equal(results[2]["pixel_values"][0], image.preprocess(grey, SETTINGS))


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"image_size": "big"}, "parameter 'image_size' must be an integer"),
        ({"max_pixels": "0"}, "parameter 'max_pixels' must be positive"),
        (
            {"image_size": "300", "resize_shorter": "256"},
            "parameter 'resize_shorter' \\(256\\) must be at least",
        ),
        ({"jpeg_draft": "maybe"}, "parameter 'jpeg_draft' must be true or false, got 'maybe'"),
    ],
)
def test_settings_from_parameters_raise_configuration_error_naming_model_and_parameter(
    parameters, message
):
    with pytest.raises(ConfigurationError, match="model 'image_preprocess': " + message):
        image.PreprocessSettings.from_parameters(parameters, "image_preprocess")


def test_settings_from_parameters_parse_strings_when_values_are_valid():
    settings = image.PreprocessSettings.from_parameters(
        {"image_size": "192", "max_pixels": "1000000"}, "image_preprocess"
    )
    assert settings == image.PreprocessSettings(
        image_size=192, resize_shorter=256, max_pixels=1_000_000
    )


# --- top-k ----------------------------------------------------------------------------------------


def test_softmax_rows_sum_to_one_and_stay_finite_when_logits_are_large():
    logits = np.array([[1e4, 0.0, -1e4], [3.0, 3.0, 3.0]], np.float32)
    probabilities = topk.softmax(logits)
    assert np.isfinite(probabilities).all()
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(probabilities[1], 1 / 3, rtol=1e-6)


def test_top_k_matches_a_full_sort_when_logits_are_random():
    logits = np.random.default_rng(0).normal(size=(16, 1000)).astype(np.float32)
    indices, scores = topk.top_k(logits, 5)
    expected = np.argsort(-logits, axis=1)[:, :5]
    np.testing.assert_array_equal(indices, expected)
    assert indices.dtype == np.int64 and scores.dtype == np.float32
    exp = np.exp(logits.astype(np.float64))
    np.testing.assert_allclose(
        scores, np.take_along_axis(exp / exp.sum(1, keepdims=True), expected, 1), rtol=1e-5
    )
    assert (np.diff(scores, axis=1) <= 0).all()


def test_top_k_keeps_the_lower_index_first_when_logits_tie():
    indices, _ = topk.top_k(np.array([[0.0, 2.0, 1.0, 2.0]], np.float32), 3)
    np.testing.assert_array_equal(indices, [[1, 3, 2]])


def test_load_labels_reads_1000_imagenet_names_after_the_header_when_file_is_shipped():
    labels = topk.load_labels(LABELS)
    assert len(labels) == 1000
    assert labels[0] == b"tench, Tinca tinca"
    assert all(b"cat" in labels[i] for i in range(281, 286))
    assert labels[967] == b"espresso"


def test_load_labels_raises_naming_file_and_line_when_a_label_is_empty(tmp_path):
    path = tmp_path / "labels.txt"
    path.write_text("# header\ncat\n\ndog\n")
    with pytest.raises(ValueError, match=f"labels file {path}: line 3 is empty"):
        topk.load_labels(path)


def test_postprocess_requests_returns_indices_scores_labels_per_request_when_batch_is_mixed():
    labels = np.array([f"class {i}".encode() for i in range(10)], dtype=np.object_)
    logits = np.arange(30, dtype=np.float32).reshape(3, 10) % 7
    requests = [
        {"logits": logits[:2]},
        {"logits": np.full((1, 10), np.nan, np.float32)},
        {"logits": np.zeros((1, 9), np.float32)},
        {"logits": np.zeros((1, 10), np.int64)},
        {"logits": logits[2:]},
    ]
    results = topk.postprocess_requests(requests, labels, 3)
    assert "input 'logits': holds NaN" in str(results[1])
    assert "input 'logits': expected shape [batch, 10], got [1, 9]" in str(results[2])
    assert "input 'logits': expected FP32 values, got dtype int64" in str(results[3])
    for result, rows in ((results[0], logits[:2]), (results[4], logits[2:])):
        expected, _ = topk.top_k(rows, 3)
        np.testing.assert_array_equal(result["class_index"], expected)
        assert result["label"].tolist() == [
            [f"class {i}".encode() for i in row] for row in expected
        ]
        assert result["score"].shape == (len(rows), 3)


def test_postprocess_requests_raises_when_k_exceeds_the_labels():
    with pytest.raises(ValueError, match="top_k must be between 1 and 2"):
        topk.postprocess_requests([], np.array([b"a", b"b"], dtype=np.object_), 3)


# --- JPEG draft mode on real photos: what it saves must not change the answer -------------------


@pytest.mark.torch
@pytest.mark.parametrize("name", ["chelsea.png", "coffee.png", "rocket.jpg", "astronaut.png"])
def test_jpeg_draft_keeps_the_top5_of_the_full_decode_on_phone_sized_photos(name, built_repository):
    import skimage
    from pipeline_ops.onnx_session import make_session

    photo = Image.open(pathlib.Path(skimage.__file__).parent / "data" / name).convert("RGB")
    scale = max(2, int((12e6 / (photo.width * photo.height)) ** 0.5))  # ~12 MP, as a phone photo
    data = encode(photo.resize((photo.width * scale, photo.height * scale), Image.Resampling.BICUBIC),
                  "JPEG", quality=90)
    session = make_session(pathlib.Path(built_repository) / "efficientnet_lite0" / "1" / "model.onnx", 1)
    full = image.PreprocessSettings(jpeg_draft=False)

    def top5(settings):
        (logits,) = session.run(["logits"], {"pixel_values": image.preprocess(data, settings)[None]})
        return topk.top_k(logits, 5)[0][0].tolist()

    drafted = image.decode(data, SETTINGS.max_pixels, 2 * SETTINGS.resize_shorter)
    assert min(drafted.size) >= 2 * SETTINGS.resize_shorter
    assert drafted.size[0] <= -(-photo.width * scale // 4)  # at 1/4 or 1/8 of the side (rounded up)
    assert top5(SETTINGS) == top5(full)
