"""Image preprocessing for the classifier: encoded JPEG/PNG bytes to normalised CHW float32.

Decodes each image on its own (a bad one rejects only its request), then returns one stacked
array per ``execute`` call through ``run_batched``.

Decisions, kept identical in the served model and the in-process reference (both call this):

* Formats: JPEG and PNG only; anything else is rejected without trying other Pillow plugins.
* Size guard: the declared width × height is read from the header (``Image.open`` does not
  decode pixels) and an image above ``max_pixels`` is rejected before any pixel is decoded.
  Pillow's own ``DecompressionBombError`` is caught too. Truncated data is rejected:
  ``ImageFile.LOAD_TRUNCATED_IMAGES`` is never set, so Pillow raises instead of padding grey.
* Channels: every image becomes 8-bit RGB. Grey (1-, 8- or 16-bit) is replicated to three
  channels, palettes are expanded, CMYK goes through Pillow's conversion (ICC profiles are not
  applied), and alpha is composited over white, the way a viewer shows a transparent image.
* Orientation: the EXIF orientation tag is applied, so a phone photo is classified upright.
* Geometry: the shorter side is resized to ``resize_shorter`` and the centre
  ``image_size`` × ``image_size`` square is kept, computed in one bicubic resize of the source
  box (bicubic, as TensorFlow's EfficientNet evaluation does; resizing only the crop box also
  keeps a 1 × 100000 image from growing a huge intermediate). Large JPEGs are decoded at a
  reduced DCT scale (draft mode) that still leaves the shorter side at least twice
  ``resize_shorter``: 4-5x faster decode + resize of a 12 MP photo, top-5 unchanged on the
  photos checked, where a draft down to ``resize_shorter`` itself moved rank 5 on 7 of 14
  (docs/performance.md).
* Values: ``(x - 127.5) / 127.5``, so pixels lie in [-1, 1], channels first. With the ``mean``
  and ``std`` parameters (per channel, on pixels scaled to [0, 1], as torchvision/timm declare
  them): ``(x / 255 - mean) / std``. ``channel_order`` ``BGR`` reverses the channels.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps

from .batching import Prepared, run_batched
from .errors import ConfigurationError, InvalidInput

INPUT_NAME = "IMAGE"
OUTPUT_NAME = "pixel_values"
FORMATS = ("JPEG", "PNG")
RESAMPLE = Image.Resampling.BICUBIC
BACKGROUND = (255, 255, 255)  # transparent pixels are shown over white

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# JPEG start-of-frame markers (they carry the image size): C0-CF except DHT, JPG, DAC.
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


@dataclass(frozen=True)
class PreprocessSettings:
    """The ``image_preprocess`` config parameters.

    Attributes:
        image_size: side of the square output (``pixel_values`` is ``[3, image_size, image_size]``).
        resize_shorter: the shorter side is resized to this before the centre crop.
        max_pixels: largest declared width × height accepted; larger images are rejected before
            decoding.
        mean: per-channel mean on [0, 1] pixels (with ``std``); None: ``(x - 127.5) / 127.5``.
        std: per-channel standard deviation on [0, 1] pixels (with ``mean``).
        channel_order: ``RGB`` or ``BGR``, the order of the output channels.
        jpeg_draft: decode a large JPEG at a reduced DCT scale (1/2, 1/4 or 1/8) that keeps the
            shorter side at least ``2 * resize_shorter`` (parameter ``jpeg_draft``, default on;
            docs/performance.md has the gain).
    """

    image_size: int = 224
    resize_shorter: int = 256
    max_pixels: int = 40_000_000
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None
    channel_order: str = "RGB"
    jpeg_draft: bool = True

    def __post_init__(self) -> None:
        if (self.mean is None) != (self.std is None):
            raise ConfigurationError("parameters 'mean' and 'std' go together")
        if self.std is not None and min(self.std) <= 0:
            raise ConfigurationError(f"parameter 'std' must be positive, got {self.std}")
        if self.channel_order not in ("RGB", "BGR"):
            raise ConfigurationError(
                f"parameter 'channel_order' must be RGB or BGR, got {self.channel_order!r}"
            )
        for name in ("image_size", "resize_shorter", "max_pixels"):
            if getattr(self, name) <= 0:
                raise ConfigurationError(
                    f"parameter {name!r} must be positive, got {getattr(self, name)}"
                )
        if self.resize_shorter < self.image_size:
            raise ConfigurationError(
                f"parameter 'resize_shorter' ({self.resize_shorter}) must be at least "
                f"'image_size' ({self.image_size}) so the centre crop fits"
            )

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, str], model: str) -> PreprocessSettings:
        """Build settings from Triton config parameters (string values); absent keys keep defaults.

        Raises:
            ConfigurationError: a parameter is not a positive integer (or ``resize_shorter`` is
                below ``image_size``), naming the model and the parameter.
        """
        values = {}
        for name in ("image_size", "resize_shorter", "max_pixels"):
            if name in parameters:
                try:
                    values[name] = int(parameters[name])
                except ValueError:
                    raise ConfigurationError(
                        f"model {model!r}: parameter {name!r} must be an integer, "
                        f"got {parameters[name]!r}"
                    ) from None
        for name in ("mean", "std"):
            if name in parameters:
                try:
                    channels = tuple(float(v) for v in parameters[name].split(","))
                except ValueError:
                    channels = ()
                if len(channels) != 3:
                    raise ConfigurationError(
                        f"model {model!r}: parameter {name!r} must be three comma-separated "
                        f"numbers, got {parameters[name]!r}"
                    )
                values[name] = channels
        if "channel_order" in parameters:
            values["channel_order"] = parameters["channel_order"].upper()
        if "jpeg_draft" in parameters:
            flag = parameters["jpeg_draft"].strip().lower()
            if flag not in ("true", "false", "1", "0"):
                raise ConfigurationError(
                    f"model {model!r}: parameter 'jpeg_draft' must be true or false, "
                    f"got {parameters['jpeg_draft']!r}"
                )
            values["jpeg_draft"] = flag in ("true", "1")
        try:
            return cls(**values)
        except ConfigurationError as exc:
            raise ConfigurationError(f"model {model!r}: {exc}") from None


def _problem(row: int | None, text: str) -> InvalidInput:
    where = f"input '{INPUT_NAME}'" if row is None else f"input '{INPUT_NAME}' row {row}"
    return InvalidInput(f"{where}: {text}")


def _too_large(row: int | None, size: tuple[int, int], max_pixels: int) -> InvalidInput:
    width, height = size
    return _problem(
        row,
        f"declared image size {width}x{height} ({width * height} pixels) exceeds "
        f"max_pixels={max_pixels}; rejected before decoding",
    )


def declared_size(data: bytes) -> tuple[int, int] | None:
    """Width and height a PNG or JPEG header declares, read without Pillow; None if not found.

    Used to explain a header Pillow refuses (Pillow reports a 0 × 0 image only as unidentified).
    """
    if data.startswith(_PNG_SIGNATURE) and data[12:16] == b"IHDR" and len(data) >= 24:
        return struct.unpack(">II", data[16:24])
    if not data.startswith(b"\xff\xd8"):
        return None
    pos = 2
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        (length,) = struct.unpack(">H", data[pos + 2 : pos + 4])
        if marker in _JPEG_SOF and pos + 9 <= len(data):
            height, width = struct.unpack(">HH", data[pos + 5 : pos + 9])
            return width, height
        pos += 2 + length
    return None


def _to_rgb(image: Image.Image) -> Image.Image:
    """Convert any decoded PNG/JPEG mode to 8-bit RGB (see the module docstring)."""
    if image.mode.startswith("I"):  # 16-bit grey PNG; Pillow's own conversion would clip at 255
        grey = np.asarray(image, dtype=np.float32) * (255.0 / 65535.0)
        image = Image.fromarray(np.clip(np.rint(grey), 0, 255).astype(np.uint8), mode="L")
    has_alpha = image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info
    if has_alpha:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, BACKGROUND + (255,))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")


def decode(
    data: bytes, max_pixels: int, min_side: int = 0, row: int | None = None
) -> Image.Image:
    """Decode JPEG/PNG bytes to an upright 8-bit RGB image, refusing oversized or broken data.

    Args:
        data: the encoded image.
        max_pixels: largest declared width × height accepted.
        min_side: if positive, a JPEG may be decoded at a reduced DCT scale that keeps both
            sides at least this long (JPEG draft mode).
        row: the batch row, for the error message.

    Returns:
        The decoded RGB image.

    Raises:
        InvalidInput: empty, not JPEG/PNG, zero-size, larger than ``max_pixels``, truncated or
            corrupt; the message names the input and the problem.
    """
    if len(data) == 0:
        raise _problem(row, "the image is empty (0 bytes)")
    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)
    except Image.DecompressionBombError as exc:  # beyond Pillow's own limit
        size = declared_size(data)
        if size is not None and size[0] * size[1] > max_pixels:
            raise _too_large(row, size, max_pixels) from None
        raise _problem(row, f"rejected as a decompression bomb before decoding ({exc})") from None
    except Image.UnidentifiedImageError:
        size = declared_size(data)
        if size is not None and 0 in size:
            raise _problem(row, f"zero-size image (declared {size[0]}x{size[1]})") from None
        raise _problem(row, f"not a decodable {' or '.join(FORMATS)} image") from None
    except (OSError, SyntaxError, ValueError, struct.error, EOFError) as exc:
        raise _problem(row, f"corrupt image header ({str(exc) or type(exc).__name__})") from None
    width, height = image.size
    if width * height > max_pixels:
        raise _too_large(row, image.size, max_pixels)
    if image.format == "JPEG" and min_side > 0:
        image.draft(None, (min_side, min_side))
    try:
        image.load()
        ImageOps.exif_transpose(image, in_place=True)
    except (OSError, SyntaxError, ValueError, struct.error, EOFError) as exc:
        text = str(exc) or type(exc).__name__
        if "truncated" in text.lower():
            raise _problem(row, f"truncated {image.format} data ({text})") from None
        raise _problem(row, f"corrupt {image.format} data ({text})") from None
    return _to_rgb(image)


def resize_and_crop(image: Image.Image, resize_shorter: int, image_size: int) -> Image.Image:
    """Resize the shorter side to ``resize_shorter`` and keep the centre square of ``image_size``.

    Done as one resize of the matching source box, so only the output pixels are computed.
    """
    width, height = image.size
    side = min(width, height) * image_size / resize_shorter  # the crop, in source pixels
    left, top = (width - side) / 2, (height - side) / 2
    return image.resize(
        (image_size, image_size), RESAMPLE, box=(left, top, left + side, top + side)
    )


def normalise(image: Image.Image, settings: PreprocessSettings | None = None) -> np.ndarray:
    """RGB image to float32 ``[3, H, W]``: ``(x - 127.5) / 127.5``, or by the settings' mean/std.

    ``settings`` also gives the channel order; without settings, the defaults (RGB, ±1 scale).
    """
    pixels = np.asarray(image, dtype=np.float32)
    if settings is None or settings.mean is None:
        values = (pixels - 127.5) / 127.5
    else:
        mean = np.asarray(settings.mean, dtype=np.float32)
        std = np.asarray(settings.std, dtype=np.float32)
        values = (pixels / np.float32(255.0) - mean) / std
    if settings is not None and settings.channel_order == "BGR":
        values = values[:, :, ::-1]
    return np.ascontiguousarray(values.transpose(2, 0, 1))


def preprocess(data: bytes, settings: PreprocessSettings, row: int | None = None) -> np.ndarray:
    """One encoded image to ``pixel_values`` float32 ``[3, image_size, image_size]``.

    Raises:
        InvalidInput: the image cannot be used (see ``decode``).
    """
    # Draft only down to twice the resize target: the bicubic resize still has pixels to
    # average, and the top-5 stays that of the full decode.
    draft_to = 2 * settings.resize_shorter if settings.jpeg_draft else 0
    image = decode(data, settings.max_pixels, draft_to, row)
    return normalise(resize_and_crop(image, settings.resize_shorter, settings.image_size), settings)


def prepare_request(
    inputs: Mapping[str, np.ndarray | None], settings: PreprocessSettings
) -> Prepared:
    """Validate one request's ``IMAGE`` tensor (``[rows, 1]`` bytes) and preprocess every row.

    Returns:
        ``{"pixel_values": float32 [rows, 3, image_size, image_size]}``.

    Raises:
        InvalidInput: missing input, wrong dtype or rank, or an unusable image; the message
            names the input, the row and the problem.
    """
    images = inputs.get(INPUT_NAME)
    if images is None:
        raise _problem(None, "missing from the request")
    images = np.asarray(images)
    if images.dtype != np.object_ and images.dtype.kind != "S":
        raise _problem(None, f"expected BYTES (encoded image) elements, got dtype {images.dtype}")
    if images.ndim != 2 or images.shape[1] != 1:
        raise _problem(None, f"expected shape [batch, 1], got {list(images.shape)}")
    rows = []
    for row, item in enumerate(images[:, 0]):
        if not isinstance(item, (bytes, bytearray)):
            raise _problem(row, f"expected encoded image bytes, got {type(item).__name__}")
        rows.append(preprocess(bytes(item), settings, row))
    size = settings.image_size
    stacked = np.stack(rows) if rows else np.empty((0, 3, size, size), np.float32)
    return {OUTPUT_NAME: stacked}


def preprocess_requests(
    requests: Sequence[Mapping[str, np.ndarray | None]], settings: PreprocessSettings
) -> list[dict[str, np.ndarray] | Exception]:
    """Preprocess all requests of one ``execute`` call; a bad request fails alone.

    Returns:
        Per request, ``{"pixel_values": ...}`` or the exception that failed it (``InvalidInput``
        for a bad image).
    """
    return run_batched(
        requests,
        lambda inputs: prepare_request(inputs, settings),
        lambda prepared: {OUTPUT_NAME: np.concatenate([p[OUTPUT_NAME] for p in prepared])},
    )
