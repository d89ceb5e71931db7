"""End to end through the real server: ``image_classification`` over HTTP and gRPC.

Served top-k must equal in-process PyTorch top-k on the same images; every bad image gets its own
error naming ``IMAGE`` and the problem, the server stays ready and good requests keep working.
"""

from __future__ import annotations

import concurrent.futures
import io
import pathlib
import shutil
from collections.abc import Callable

import numpy as np
import pytest
import skimage
import torch
import tritonclient.grpc as tritonclient_grpc
import tritonclient.http as tritonclient_http
from PIL import Image
from pipeline_ops import image, topk
from tritonclient.utils import InferenceServerException

from tools.errors import ServerError
from tools.models import efficientnet_lite0

pytestmark = [pytest.mark.server, pytest.mark.torch]

MODEL = "image_classification"
STEPS = ("image_preprocess", "efficientnet_lite0", "image_postprocess")
IMAGES = pathlib.Path(__file__).parent / "data" / "images"
PHOTOS = pathlib.Path(skimage.__file__).parent / "data"
LABELS = (
    pathlib.Path(__file__).parents[1] / "backends" / "python" / "image_postprocess" / "labels.txt"
)
CAT_CLASSES = set(range(281, 286))
COFFEE_CLASSES = {967, 968}
SCORE_ATOL = 1e-4  # ONNX Runtime vs PyTorch on probabilities

# Good images: real photos, plus every channel layout the preprocessing converts to RGB.
GOOD = {
    "chelsea.png": PHOTOS / "chelsea.png",
    "coffee.png": PHOTOS / "coffee.png",
    "rocket.jpg": PHOTOS / "rocket.jpg",
    "chelsea_small.jpg": IMAGES / "chelsea_small.jpg",
    "grey": IMAGES / "chelsea_grey.png",
    "grey16": IMAGES / "coffee_grey16.png",
    "palette": IMAGES / "chelsea_palette.png",
    "cmyk": IMAGES / "chelsea_cmyk.jpg",
    "rgba": IMAGES / "coffee_rgba.png",
    "exif_rotated": IMAGES / "coffee_exif_rotated.jpg",
}


def _bytes_tensor(*items: bytes) -> np.ndarray:
    return np.array([[item] for item in items], dtype=np.object_).reshape(len(items), 1)


def _gif() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), (10, 200, 30)).save(buffer, "GIF")
    return buffer.getvalue()


# name -> (IMAGE tensor, Triton datatype, words the error must contain besides "IMAGE")
BAD = {
    "corrupt_bytes": (
        lambda: _bytes_tensor((IMAGES / "not_an_image.bin").read_bytes()),
        "BYTES",
        ["not a decodable JPEG or PNG image"],
    ),
    "gif_not_jpeg_or_png": (
        lambda: _bytes_tensor(_gif()),
        "BYTES",
        ["not a decodable JPEG or PNG"],
    ),
    "truncated_jpeg": (
        lambda: _bytes_tensor((IMAGES / "truncated.jpg").read_bytes()),
        "BYTES",
        ["truncated JPEG data"],
    ),
    "zero_size_png": (
        lambda: _bytes_tensor((IMAGES / "zero_size.png").read_bytes()),
        "BYTES",
        ["zero-size image"],
    ),
    "empty_bytes": (lambda: _bytes_tensor(b""), "BYTES", ["empty (0 bytes)"]),
    "bomb_header": (
        lambda: _bytes_tensor((IMAGES / "bomb_header.png").read_bytes()),
        "BYTES",
        ["100000x100000", "exceeds max_pixels", "before decoding"],
    ),
    "bomb_64mpx": (
        lambda: _bytes_tensor((IMAGES / "bomb_64mpx.png").read_bytes()),
        "BYTES",
        ["8000x8000", "exceeds max_pixels", "before decoding"],
    ),
    "bad_row_in_batch": (
        lambda: _bytes_tensor(
            (IMAGES / "chelsea_small.jpg").read_bytes(), (IMAGES / "truncated.jpg").read_bytes()
        ),
        "BYTES",
        ["row 1", "truncated JPEG"],
    ),
    "wrong_dtype": (lambda: np.zeros((1, 1), np.float32), "FP32", ["data-type", "FP32", "BYTES"]),
    "wrong_rank_1d": (lambda: np.array([b"x"], dtype=np.object_), "BYTES", ["shape", "[1]"]),
    "wrong_rank_3d": (
        lambda: np.array([[[b"x"]]], dtype=np.object_),
        "BYTES",
        ["shape", "[1,1,1]"],
    ),
    "empty_batch": (lambda: np.empty((0, 1), dtype=np.object_), "BYTES", ["got 0"]),
}


class Classifier:
    """One protocol's client for ``image_classification``."""

    def __init__(self, protocol: str, url: str) -> None:
        self.protocol = protocol
        self.url = url
        self.module = tritonclient_http if protocol == "http" else tritonclient_grpc
        self.client = self.module.InferenceServerClient(url)

    def infer(self, tensor: np.ndarray, datatype: str = "BYTES") -> dict[str, np.ndarray]:
        """Send one request: CLASS_INDEX, SCORE, LABEL, or an InferenceServerException."""
        data = self.module.InferInput("IMAGE", list(tensor.shape), datatype)
        data.set_data_from_numpy(tensor)
        result = self.client.infer(MODEL, [data])
        return {name: result.as_numpy(name) for name in ("CLASS_INDEX", "SCORE", "LABEL")}

    def classify(self, *paths: pathlib.Path) -> dict[str, np.ndarray]:
        """Classify image files as one request of ``len(paths)`` rows."""
        return self.infer(_bytes_tensor(*(p.read_bytes() for p in paths)))

    def all_ready(self) -> bool:
        """Server and every model of the pipeline report ready."""
        return self.client.is_server_ready() and all(
            self.client.is_model_ready(m) for m in (MODEL, *STEPS)
        )

    def counts(self, model: str) -> tuple[int, int]:
        """(inference_count, execution_count) of ``model`` from Triton's statistics."""
        stats = self.client.get_inference_statistics(model)
        if self.protocol == "grpc":
            entry = stats.model_stats[0]
            return int(entry.inference_count), int(entry.execution_count)
        entry = stats["model_stats"][0]
        return int(entry["inference_count"]), int(entry["execution_count"])

    def close(self) -> None:
        self.client.close()


@pytest.fixture(params=["http", "grpc"])
def classifier(request, triton_server):
    url = triton_server.http_url if request.param == "http" else triton_server.grpc_url
    client = Classifier(request.param, url)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="module")
def labels() -> list[str]:
    return [name.decode() for name in topk.load_labels(LABELS)]


@pytest.fixture(scope="module")
def reference() -> Callable[[pathlib.Path, int], tuple[list[int], list[float]]]:
    """In-process top-k: the same preprocessing function, the PyTorch model, ``torch.topk``."""
    model = efficientnet_lite0.build_model()
    settings = image.PreprocessSettings()
    cache: dict[tuple[pathlib.Path, int], tuple[list[int], list[float]]] = {}

    def top_k(path: pathlib.Path, k: int) -> tuple[list[int], list[float]]:
        if (path, k) not in cache:
            pixels = torch.from_numpy(image.preprocess(path.read_bytes(), settings)[None])
            with torch.no_grad():
                scores, indices = model(pixels).softmax(-1)[0].topk(k)
            cache[path, k] = indices.tolist(), scores.tolist()
        return cache[path, k]

    return top_k


def assert_matches_reference(row: dict[str, np.ndarray], expected, labels, what: str) -> None:
    indices, scores = expected
    assert row["CLASS_INDEX"].tolist() == indices, f"{what}: served top-k differs from PyTorch"
    np.testing.assert_allclose(row["SCORE"], scores, atol=SCORE_ATOL, err_msg=what)
    assert [label.decode() for label in row["LABEL"]] == [labels[i] for i in indices], what


def assert_rejected(exc: InferenceServerException, words: list[str]) -> None:
    message = exc.message()
    assert "IMAGE" in message, message
    for word in words:
        assert word in message, message
    assert str(exc.status()) in ("400", "StatusCode.INVALID_ARGUMENT"), exc.status()


# --- parity and real photos -----------------------------------------------------------------------


def test_served_top_k_equals_in_process_pytorch_top_k_when_images_are_sent_one_by_one(
    classifier, reference, labels
):
    for name, path in GOOD.items():
        served = classifier.classify(path)
        k = served["CLASS_INDEX"].shape[1]
        row = {key: value[0] for key, value in served.items()}
        assert_matches_reference(row, reference(path, k), labels, f"{classifier.protocol} {name}")


def test_served_top_k_equals_in_process_pytorch_top_k_when_images_share_one_request(
    classifier, reference, labels
):
    paths = list(GOOD.values())
    served = classifier.classify(*paths)
    assert served["CLASS_INDEX"].shape[0] == len(paths)
    k = served["CLASS_INDEX"].shape[1]
    for i, (name, path) in enumerate(GOOD.items()):
        row = {key: value[i] for key, value in served.items()}
        assert_matches_reference(row, reference(path, k), labels, f"{classifier.protocol} {name}")


def test_chelsea_lands_in_cat_classes_and_coffee_in_espresso_or_cup_when_served(classifier):
    served = classifier.classify(PHOTOS / "chelsea.png", PHOTOS / "coffee.png")
    cat, coffee = served["CLASS_INDEX"][:, 0].tolist()
    print(
        f"{classifier.protocol}: chelsea -> {cat} {served['LABEL'][0, 0]!r}, "
        f"coffee -> {coffee} {served['LABEL'][1, 0]!r}"
    )
    assert cat in CAT_CLASSES
    assert coffee in COFFEE_CLASSES
    assert np.all(np.diff(served["SCORE"], axis=1) <= 0)  # best first


# --- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_image_gets_its_own_error_and_server_keeps_serving_when_sent(classifier, case):
    make, datatype, words = BAD[case]
    with pytest.raises(InferenceServerException) as caught:
        classifier.infer(make(), datatype)
    assert_rejected(caught.value, words)
    assert classifier.all_ready()
    served = classifier.classify(PHOTOS / "chelsea.png")
    assert served["CLASS_INDEX"][0, 0] in CAT_CLASSES


def test_bad_request_fails_alone_when_sent_concurrently_with_good_ones(
    classifier, triton_server, reference, labels
):
    good = [GOOD["chelsea.png"], GOOD["coffee.png"], GOOD["grey"], GOOD["rocket.jpg"]] * 2
    bad_positions = {3, 6}
    work = list(good)
    for position in sorted(bad_positions):
        work.insert(position, IMAGES / "truncated.jpg")
    url = triton_server.http_url if classifier.protocol == "http" else triton_server.grpc_url

    def send(path: pathlib.Path):
        client = Classifier(classifier.protocol, url)  # one client per thread
        try:
            return client.classify(path)
        except InferenceServerException as exc:
            return exc
        finally:
            client.close()

    merged = False
    for _ in range(5):  # until the dynamic batcher has merged requests into one execute call
        before = classifier.counts("image_preprocess")
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(work)) as pool:
            results = list(pool.map(send, work))
        for i, (path, result) in enumerate(zip(work, results, strict=True)):
            if i in bad_positions:
                assert isinstance(result, InferenceServerException), f"request {i} should fail"
                assert_rejected(result, ["truncated JPEG data"])
            else:
                assert not isinstance(result, Exception), f"request {i} ({path.name}): {result}"
                row = {key: value[0] for key, value in result.items()}
                k = len(row["CLASS_INDEX"])
                assert_matches_reference(row, reference(path, k), labels, f"request {i}")
        after = classifier.counts("image_preprocess")
        inferences, executions = after[0] - before[0], after[1] - before[1]
        print(f"{classifier.protocol}: image_preprocess: {inferences} rows, {executions} calls")
        if executions < inferences:
            merged = True
            break
    assert merged, "image_preprocess never received more than one request per execute call"
    assert classifier.all_ready()


# --- configuration errors -------------------------------------------------------------------------


def _with_parameter(config_path: pathlib.Path, key: str, value: str) -> None:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    config = text_format.Parse(config_path.read_text(), model_config_pb2.ModelConfig())
    config.parameters[key].string_value = value
    config_path.write_text(text_format.MessageToString(config))


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("top_k", "3", "output 'class_index' has dims [5], expected [3] for top_k=3"),
        ("labels_file", "missing.txt", "missing.txt does not exist"),
    ],
)
def test_image_postprocess_refuses_to_load_when_its_parameters_disagree(
    built_repository, server_factory, tmp_path, key, value, problem
):
    repository = tmp_path / "repository"
    shutil.copytree(built_repository / "image_postprocess", repository / "image_postprocess")
    _with_parameter(repository / "image_postprocess" / "config.pbtxt", key, value)
    with pytest.raises(ServerError) as caught:
        server_factory(repository, timeout_s=120)
    assert "model 'image_postprocess'" in str(caught.value)
    assert problem in str(caught.value)
