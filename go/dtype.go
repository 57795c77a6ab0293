package pybridge

// Element types, which every file of the package uses: Numeric (what collectives take),
// Float (what a gradient or a federated model may be), DType (a Tensor's or a parameter's
// element type, as the C ABI codes it).

/*
#include "pbgo.h"
*/
import "C"

import (
	"reflect"
	"strconv"
)

// Numeric is the set of element types that collectives accept: the eight
// dtypes of the C ABI. Types defined over the built-in ones (type T float32)
// are accepted too; half-precision data uses Float16 and BFloat16.
type Numeric interface {
	~float32 | ~float64 | ~int8 | ~uint8 | ~int32 | ~int64 | Float16 | BFloat16
}

// Element type codes of pybridge.h.
const (
	dtFloat32  = C.PB_FLOAT32
	dtFloat64  = C.PB_FLOAT64
	dtFloat16  = C.PB_FLOAT16
	dtBFloat16 = C.PB_BFLOAT16
	dtInt8     = C.PB_INT8
	dtUint8    = C.PB_UINT8
	dtInt32    = C.PB_INT32
	dtInt64    = C.PB_INT64
)

// dtypeOf maps T to its C dtype code. Float16 and BFloat16 share uint16 as
// their underlying type, so they are told apart by name before the kind decides.
func dtypeOf[T Numeric]() C.int32_t {
	var zero T
	switch any(zero).(type) {
	case Float16:
		return dtFloat16
	case BFloat16:
		return dtBFloat16
	}
	switch reflect.TypeOf(zero).Kind() {
	case reflect.Float32:
		return dtFloat32
	case reflect.Float64:
		return dtFloat64
	case reflect.Int8:
		return dtInt8
	case reflect.Uint8:
		return dtUint8
	case reflect.Int32:
		return dtInt32
	default: // reflect.Int64: the constraint admits nothing else
		return dtInt64
	}
}

// Float is the set of element types a gradient may have.
type Float interface {
	~float32 | ~float64 | Float16 | BFloat16
}

// DType is an element type (the PB_FLOAT32 ... PB_INT64 codes of pybridge.h):
// of a Tensor, or of a reducer parameter (floating point only).
type DType int32

// Element types. Gradients are one of the first four.
const (
	DTypeFloat32  DType = dtFloat32
	DTypeFloat64  DType = dtFloat64
	DTypeFloat16  DType = dtFloat16
	DTypeBFloat16 DType = dtBFloat16
	DTypeInt8     DType = dtInt8
	DTypeUint8    DType = dtUint8
	DTypeInt32    DType = dtInt32
	DTypeInt64    DType = dtInt64
)

func (d DType) String() string {
	switch d {
	case DTypeFloat32:
		return "float32"
	case DTypeFloat64:
		return "float64"
	case DTypeFloat16:
		return "float16"
	case DTypeBFloat16:
		return "bfloat16"
	case DTypeInt8:
		return "int8"
	case DTypeUint8:
		return "uint8"
	case DTypeInt32:
		return "int32"
	case DTypeInt64:
		return "int64"
	case DTypeTorch:
		return "libtorch tensor"
	}
	return "DType(" + strconv.Itoa(int(d)) + ")"
}

// DTypeOf returns the DType of T.
func DTypeOf[T Float]() DType { return DType(dtypeOf[T]()) }
