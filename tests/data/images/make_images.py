"""Regenerates the small test images in this folder from scikit-image's bundled photos.

Run once with ``python tests/data/images/make_images.py``; the outputs are committed test data.
"""

from __future__ import annotations

import io
import pathlib
import struct
import zlib

import numpy as np
import skimage
from PIL import Image

HERE = pathlib.Path(__file__).resolve().parent
PHOTOS = pathlib.Path(skimage.__file__).resolve().parent / "data"


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_header_only(width: int, height: int) -> bytes:
    """A PNG signature + IHDR (8-bit RGB) + empty IDAT + IEND declaring ``width`` x ``height``."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", zlib.compress(b""))
        + _png_chunk(b"IEND", b"")
    )


def _save(image: Image.Image, name: str, **options) -> None:
    image.save(HERE / name, **options)


def main() -> None:
    """Write every test image."""
    cat = Image.open(PHOTOS / "chelsea.png").convert("RGB").resize((300, 200), Image.BICUBIC)
    cup = Image.open(PHOTOS / "coffee.png").convert("RGB").resize((300, 200), Image.BICUBIC)

    _save(cat, "chelsea_small.jpg", quality=90)
    _save(cat.convert("L"), "chelsea_grey.png")
    _save(cat.convert("P", palette=Image.Palette.ADAPTIVE), "chelsea_palette.png")
    _save(cat.convert("CMYK"), "chelsea_cmyk.jpg", quality=90)

    rgba = cup.convert("RGBA")
    alpha = np.full((200, 300), 255, np.uint8)
    alpha[:, :60] = 0  # a transparent band on the left
    rgba.putalpha(Image.fromarray(alpha))
    _save(rgba, "coffee_rgba.png")

    grey16 = (np.asarray(cup.convert("L"), dtype=np.uint32) * 257).astype(np.uint16)
    _save(Image.fromarray(grey16), "coffee_grey16.png")

    # Stored rotated; the EXIF orientation 6 tag says "rotate 90 degrees clockwise to display".
    exif = Image.Exif()
    exif[0x0112] = 6
    _save(
        cup.transpose(Image.Transpose.ROTATE_90), "coffee_exif_rotated.jpg", quality=90, exif=exif
    )

    encoded = io.BytesIO()
    cat.save(encoded, "JPEG", quality=90)
    (HERE / "truncated.jpg").write_bytes(encoded.getvalue()[: len(encoded.getvalue()) // 2])
    (HERE / "not_an_image.bin").write_bytes(b"GIF? no: these bytes are not an encoded image\n" * 4)
    (HERE / "zero_size.png").write_bytes(png_header_only(0, 0))
    # Header declares 100000 x 100000 (10^10 pixels, 30 GB as RGB): Pillow's own bomb limit.
    (HERE / "bomb_header.png").write_bytes(png_header_only(100_000, 100_000))
    # A complete, valid 1-bit 8000 x 8000 PNG (64 Mpx, under Pillow's limit, above ours).
    _save(Image.new("1", (8000, 8000), 0), "bomb_64mpx.png", optimize=True)


if __name__ == "__main__":
    main()
