"""What this CPU gives int8 MatMuls (OpenVINO's and ONNX Runtime's), and which built int8 models
it would serve wrong.

With VNNI (AVX512_VNNI, AVX-VNNI) or AMX, a u8 x s8 dot product is summed exactly in int32.
Without it (AVX2, AVX-512 without VNNI: e.g. AMD Zen 3) both OpenVINO's CPU plugin and ONNX
Runtime's MLAS multiply with ``vpmaddubsw``, whose pairwise sums saturate at int16: 8-bit weights
overflow. MiniLM's int8 fell to cosine 0.912 (OpenVINO) and 0.982 (ONNX Runtime dynamic) against
fp32 on the quality set (0.99 is the gate). 7-bit weights (NNCF's overflow fix, ONNX Runtime's
``reduce_range``) cannot overflow; the products are then exact on every x86 CPU, so a model built
that way computes the same on a VNNI host and on any other.

The builds (``onnx2ov_int8``, ``onnx2int8``) quantize with 7-bit weights unless the building CPU
has VNNI and record the width in the manifest; ``tools serve`` warns about an 8-bit int8 model on
a CPU without VNNI (``mismatches``). Standard library only."""

from __future__ import annotations

import functools
from pathlib import Path

from tools.manifest import Manifest, ManifestError

# /proc/cpuinfo flags under which OpenVINO's int8 dot products cannot saturate.
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
CPUINFO = Path("/proc/cpuinfo")
WEIGHTS_BITS_VNNI = 8
WEIGHTS_BITS_SAFE = 7


@functools.lru_cache(maxsize=8)
def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str] | None:
    """The first processor's flags in ``cpuinfo``; None where there is no such file (not Linux)
    or it names no flags. Read once per file (the build asks per int8 model)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return None


def has_vnni(flags: frozenset[str] | None) -> bool:
    """Whether int8 products are summed exactly (unknown flags: assume not)."""
    return bool(flags and flags & VNNI_FLAGS)


def int8_weights_bits(flags: frozenset[str] | None) -> int:
    """The weight width an int8 model built on a CPU with ``flags`` gets: 8 with VNNI (what the
    gate measured on such CPUs), else 7 (NNCF's overflow fix)."""
    return WEIGHTS_BITS_VNNI if has_vnni(flags) else WEIGHTS_BITS_SAFE


def this_cpu_int8_weights_bits() -> int:
    """``int8_weights_bits`` of this machine: what an int8 model built here gets."""
    return int8_weights_bits(cpu_flags())


def mismatches(repository: Path, flags: frozenset[str] | None = None) -> list[str]:
    """One line per int8 model of ``repository`` (its manifest) built with 8-bit weights, which
    this CPU (``flags``, default: this machine's) would run with saturating sums; none where the
    CPU has VNNI, or the manifest is missing or unreadable."""
    flags = cpu_flags() if flags is None else flags
    if has_vnni(flags):
        return []
    try:
        manifest = Manifest.read(Path(repository))
    except ManifestError:
        return []
    lines = []
    for name, entry in sorted((manifest.models if manifest else {}).items()):
        quantize = (entry.optimization or {}).get("quantize") or {}
        if quantize.get("weights_bits") == WEIGHTS_BITS_VNNI:
            lines.append(
                f"model {name!r}: its int8 weights are 8-bit, quantized on a CPU with VNNI; this "
                f"CPU has no VNNI (AVX512_VNNI, AVX-VNNI or AMX), so its int8 sums saturate and "
                f"its outputs drift from fp32 (MiniLM: cosine 0.91). Rebuild it here (7-bit "
                f"weights, exact on every CPU): tools build-repo --only {name} --force")
    return lines
