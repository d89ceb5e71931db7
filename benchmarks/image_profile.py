"""Where the image pipeline's time goes, and what JPEG draft-mode decoding gains (top-5 checked).

Usage: python benchmarks/image_profile.py --repository model_repository [--megapixels 12] [--repeats 15]
       [--draft-factor 2] [--no-served]

Photos: scikit-image's real photos (the two large JPEGs as they are, the others re-encoded as
JPEG), each also upscaled (bicubic, by the largest whole factor that stays within
``--megapixels``, 12 as a phone photo; the served ``max_pixels`` is 16.7 MP), as a JPEG. Per photo and size, in this
process with the served code (``pipeline_ops.image``, ``pipeline_ops.topk``) and the served
encoder settings (one ONNX Runtime thread): decode with and without draft mode, resize + crop,
normalise, the model at batch 1, top-5; the top-5 with draft against the top-5 of the full
decode. Then ``image_classification`` served over HTTP at concurrency 1 (embedded server): what
the server adds over the in-process sum is the hops (HTTP, ensemble, three stubs).
Prints two markdown tables; exits 1 if draft mode changed any top-5.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "backends" / "python"))

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

PHOTOS = ("retina.jpg", "hubble_deep_field.jpg", "chelsea.png", "coffee.png", "rocket.jpg",
          "astronaut.png", "motorcycle_left.png")


def _jpeg(picture: Image.Image) -> bytes:
    out = io.BytesIO()
    picture.save(out, "JPEG", quality=90)
    return out.getvalue()


def photos(megapixels: float) -> list[tuple[str, bytes]]:
    """(label, JPEG bytes): each photo as shipped (JPEG) or re-encoded, and upscaled."""
    import skimage

    folder = Path(skimage.__file__).parent / "data"
    out = []
    for name in PHOTOS:
        path = folder / name
        picture = Image.open(path).convert("RGB")
        data = path.read_bytes() if name.endswith(".jpg") else _jpeg(picture)
        out.append((f"{name} {picture.width}x{picture.height}", data))
        scale = max(2, int((megapixels * 1e6 / (picture.width * picture.height)) ** 0.5))
        big = picture.resize((picture.width * scale, picture.height * scale), Image.Resampling.BICUBIC)
        out.append((f"{name} x{scale} {big.width}x{big.height}", _jpeg(big)))
    return out


def _median_ms(fn, repeats: int) -> tuple[float, object]:
    result, times = None, []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), result


def main() -> int:
    from pipeline_ops import image, topk
    from pipeline_ops.onnx_session import make_session

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--megapixels", type=float, default=12.0)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--served-requests", type=int, default=30)
    parser.add_argument("--draft-factor", type=int, default=2,
                        help="draft down to this many times resize_shorter (served: 2)")
    parser.add_argument("--no-served", action="store_true", help="skip the served table")
    args = parser.parse_args()
    session = make_session(args.repository / "efficientnet_lite0" / "1" / "model.onnx", 1)
    on, off = image.PreprocessSettings(), image.PreprocessSettings(jpeg_draft=False)
    rows, changed, totals = [], 0, {}
    for label, data in photos(args.megapixels):
        figures = {}
        for mode, settings in (("draft", on), ("full", off)):
            draft_to = args.draft_factor * settings.resize_shorter if settings.jpeg_draft else 0
            decode_ms, decoded = _median_ms(
                lambda: image.decode(data, settings.max_pixels, draft_to), args.repeats)
            resize_ms, cropped = _median_ms(
                lambda: image.resize_and_crop(decoded, settings.resize_shorter, settings.image_size),
                args.repeats)
            norm_ms, pixels = _median_ms(lambda: image.normalise(cropped, settings), args.repeats)
            model_ms, (logits,) = _median_ms(
                lambda: session.run(["logits"], {"pixel_values": pixels[None]}), args.repeats)
            top_ms, (classes, _) = _median_ms(lambda: topk.top_k(logits, 5), args.repeats)
            figures[mode] = dict(decoded=decoded.size, decode=decode_ms, resize=resize_ms,
                                 normalise=norm_ms, model=model_ms, topk=top_ms,
                                 top5=classes[0].tolist())
        same = figures["draft"]["top5"] == figures["full"]["top5"]
        changed += not same
        d, f = figures["draft"], figures["full"]
        total = d["decode"] + d["resize"] + d["normalise"] + d["model"] + d["topk"]
        totals[label] = (total, data)
        rows.append(
            f"| {label} | {d['decoded'][0]}x{d['decoded'][1]} | {f['decode']:.1f} → {d['decode']:.1f} "
            f"| {f['resize']:.1f} → {d['resize']:.1f} | {d['normalise']:.2f} | {d['model']:.1f} "
            f"| {d['topk']:.2f} | {f['decode'] + f['resize']:.1f} → {d['decode'] + d['resize']:.1f} "
            f"| {'same' if same else 'CHANGED ' + str(f['top5']) + ' → ' + str(d['top5'])} |"
        )
    print("| photo | decoded at (draft) | decode ms full → draft | resize+crop ms | normalise ms "
          "| model ms | top-5 ms | decode+resize ms full → draft | top-5 draft vs full |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    if not args.no_served:
        served_table(args, totals)
    return 1 if changed else 0


def served_table(args, totals: dict[str, tuple[float, bytes]]) -> None:
    """Served ``image_classification`` at concurrency 1 over HTTP against the in-process sum."""
    import tritonclient.http as httpclient

    from tools.serve.server import EmbeddedServer

    print("\n| photo | in-process sum ms (draft) | served mean ms (HTTP, c=1) | hops ms |\n|---|---|---|---|")
    with EmbeddedServer(args.repository, exit_timeout_s=10) as server:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        try:
            for label, (inprocess, data) in totals.items():
                tensor = httpclient.InferInput("IMAGE", [1, 1], "BYTES")
                tensor.set_data_from_numpy(np.array([[data]], dtype=np.object_))
                client.infer("image_classification", [tensor])  # warm
                times = []
                for _ in range(args.served_requests):
                    start = time.perf_counter()
                    client.infer("image_classification", [tensor])
                    times.append((time.perf_counter() - start) * 1000)
                served = statistics.mean(times)
                print(f"| {label} | {inprocess:.1f} | {served:.1f} | {served - inprocess:.1f} |")
        finally:
            client.close()


if __name__ == "__main__":
    sys.exit(main())
