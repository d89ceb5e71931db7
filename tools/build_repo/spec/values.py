"""The value types of the spec: targets, dtypes, dims and shapes, tensors, parameter values.

Each is read from the file as it is and read by the builders as it is (derived values are
properties), so a field is declared once.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, PlainValidator

from tools.typed_yaml import (
    NAME_PATTERN,
    Identifier,
    Number,
    fail,
    non_empty,
    show,
    strict,
)

TARGETS = ("cpu", "gpu")
BATCH_AXIS = "batch"

# spec dtype -> (Triton data type, NumPy dtype name)
DTYPES: dict[str, tuple[str, str]] = {
    "bool": ("TYPE_BOOL", "bool"),
    "uint8": ("TYPE_UINT8", "uint8"),
    "int8": ("TYPE_INT8", "int8"),
    "int32": ("TYPE_INT32", "int32"),
    "int64": ("TYPE_INT64", "int64"),
    "float16": ("TYPE_FP16", "float16"),
    "float32": ("TYPE_FP32", "float32"),
    "float64": ("TYPE_FP64", "float64"),
    "string": ("TYPE_STRING", "object"),
}
Dtype = Literal[tuple(DTYPES)]  # type: ignore[valid-type]
Target = Literal[TARGETS]  # type: ignore[valid-type]

_NAME = re.compile(NAME_PATTERN)


def _dim(value: Any) -> int | str:
    if isinstance(value, str) and _NAME.match(value):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise fail("dim", f"must be a positive integer or an axis name (identifier), got {show(value)}")


Dim = Annotated[
    int | str,
    PlainValidator(_dim, json_schema_input_type=Annotated[int, Field(gt=0)] | Identifier),
]


def _batch_first(shape: tuple[int | str, ...]) -> tuple[int | str, ...]:
    if not shape or shape[0] != BATCH_AXIS:
        raise fail("batch_axis",
                   f"must start with the batch axis {BATCH_AXIS!r}, got {show(shape)}")
    return shape


Shape = Annotated[
    tuple[Dim, ...],
    AfterValidator(_batch_first),
    Field(json_schema_extra={"prefixItems": [{"const": BATCH_AXIS}], "minItems": 1}),
]


@strict
class TensorSpec:
    """One input or output tensor. ``shape`` starts with the batch axis; named axes are dynamic."""

    name: Identifier = Field(
        description="`input`/`output` `name`. A name may appear only once in each list."
    )
    dtype: Dtype = Field(
        description="`data_type`: `TYPE_BOOL` … `TYPE_FP16`/`TYPE_FP32`/`TYPE_FP64`, "
        "`TYPE_STRING`. PyTorch models do not accept `string`."
    )
    shape: Shape = Field(
        description="The first element must be `batch`. Each other element is a positive integer "
        "(fixed) or an identifier (a dynamic axis). In config.pbtxt, `dims` is the shape without "
        "`batch`, with named axes written as `-1`."
    )

    @property
    def triton_dtype(self) -> str:
        """Triton's ``TYPE_*`` name of this tensor's dtype."""
        return DTYPES[self.dtype][0]

    @property
    def numpy_dtype(self) -> str:
        """NumPy's name of this tensor's dtype (``object`` for strings)."""
        return DTYPES[self.dtype][1]

    @property
    def dims(self) -> tuple[int, ...]:
        """Dims without the batch axis, named axes as ``-1`` (as Triton's config wants them)."""
        return tuple(-1 if isinstance(d, str) else d for d in self.shape[1:])

    @property
    def dynamic_axes(self) -> dict[int, str]:
        """Named axes by position, batch included (as ``torch.onnx.export`` wants them)."""
        return {i: d for i, d in enumerate(self.shape) if isinstance(d, str)}

    @property
    def is_ragged(self) -> bool:
        """Whether a non-batch dim varies between requests."""
        return any(isinstance(d, str) for d in self.shape[1:])


@strict
class PaddedTensorSpec(TensorSpec):
    """An input of a PyTorch model: a tensor and the value requests are padded with."""

    pad_value: Number = Field(
        0,
        description="Only for the `inputs` of `models`. On the cpu target it goes into the "
        "`pad_values` parameter, which the runner uses to pad requests to the longest one.",
    )


def _unique_names(tensors: tuple[TensorSpec, ...]) -> tuple[TensorSpec, ...]:
    names = [t.name for t in tensors]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise fail("duplicate_tensor", f"names a tensor more than once: {duplicates}")
    return tensors


def _numeric(tensor: TensorSpec) -> TensorSpec:
    if tensor.dtype == "string":
        raise fail("string_tensor", "has dtype 'string'; a PyTorch model takes numeric tensors")
    return tensor


MIN_ONE = Field(json_schema_extra={"minItems": 1})  # the schema's side of `non_empty`
Tensors = Annotated[tuple[TensorSpec, ...], AfterValidator(_unique_names)]
ModelInputs = Annotated[
    tuple[Annotated[PaddedTensorSpec, AfterValidator(_numeric)], ...],
    AfterValidator(non_empty),
    AfterValidator(_unique_names),
    MIN_ONE,
]
ModelOutputs = Annotated[
    tuple[Annotated[TensorSpec, AfterValidator(_numeric)], ...],
    AfterValidator(non_empty),
    AfterValidator(_unique_names),
    MIN_ONE,
]


def _parameter(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise fail("scalar", f"must be a string or number, got {show(value)}")
    return str(value)  # Triton's parameters are strings


def _file_name(value: Any) -> str:
    if isinstance(value, str) and value and "/" not in value:
        return value
    raise fail("file_name", f"must be a plain file name (no '/'), got {show(value)}")


# A config parameter's value: a string or a number in the file, the string Triton gets once read.
ParameterValue = Annotated[str, PlainValidator(_parameter, json_schema_input_type=str | float)]
FileName = Annotated[
    str,
    PlainValidator(
        _file_name,
        json_schema_input_type=Annotated[str, Field(pattern=r"^[^/]+$", title="file name")],
    ),
]


def _not_batch(name: str) -> str:
    if name == BATCH_AXIS:
        raise fail("batch_axis", "is set by max_batch_size, not here")
    return name


AxisName = Annotated[str, Field(pattern=NAME_PATTERN, title="axis"), AfterValidator(_not_batch)]
EntryName = Annotated[str, Field(pattern=NAME_PATTERN, title="name")]
