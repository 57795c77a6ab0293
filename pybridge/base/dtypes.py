"""The eight element types that cross the C ABI, by code, name and torch dtype."""

from typing import Any, Union

import numpy as np
import torch

from .. import abi
from ..errors import InvalidArgument

# The C ABI's dtype codes (PB_FLOAT32 ... in capi/pybridge.h).
FLOAT32, FLOAT64, FLOAT16, BFLOAT16 = abi.PB_FLOAT32, abi.PB_FLOAT64, abi.PB_FLOAT16, abi.PB_BFLOAT16
INT8, UINT8, INT32, INT64 = abi.PB_INT8, abi.PB_UINT8, abi.PB_INT32, abi.PB_INT64

BY_CODE = {
    FLOAT32: torch.float32,
    FLOAT64: torch.float64,
    FLOAT16: torch.float16,
    BFLOAT16: torch.bfloat16,
    INT8: torch.int8,
    UINT8: torch.uint8,
    INT32: torch.int32,
    INT64: torch.int64,
}
CODE_OF = {dt: code for code, dt in BY_CODE.items()}
NAMES = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "int8": torch.int8, "uint8": torch.uint8,
    "int32": torch.int32, "int64": torch.int64,
}


# What a `dtype=` argument takes: a torch dtype, a name ("bfloat16"), a numpy dtype or a C code.
DTypeLike = Union[torch.dtype, str, int, np.dtype[Any], type[np.generic]]


def torch_dtype(spec: DTypeLike) -> torch.dtype:
    """Resolve a dtype given as a code, a name, a numpy dtype or a torch dtype."""
    if isinstance(spec, torch.dtype):
        if spec not in CODE_OF:
            raise InvalidArgument(f"unsupported dtype {spec}; supported: {', '.join(NAMES)}")
        return spec
    if isinstance(spec, bool):
        raise InvalidArgument(f"unknown dtype {spec!r}")
    if isinstance(spec, int):
        if spec not in BY_CODE:
            raise InvalidArgument(f"unknown dtype code {spec}; valid codes are 0..{len(BY_CODE) - 1}")
        return BY_CODE[spec]
    name = str(getattr(spec, "name", spec))
    if name not in NAMES:
        raise InvalidArgument(f"unsupported dtype {spec!r}; supported: {', '.join(NAMES)}")
    return NAMES[name]


def code(dtype: torch.dtype) -> int:
    """The C ABI's code (PB_FLOAT32 ...) of a supported dtype."""
    return CODE_OF[torch_dtype(dtype)]
