package pybridge

import (
	"math"
	"strconv"
)

// Float16 is an IEEE 754 half-precision number held as its raw bits, the
// layout of torch.float16. Convert with Float16FromFloat32 and Float32.
type Float16 uint16

// BFloat16 is a bfloat16 number (the top half of a float32) held as its raw
// bits, the layout of torch.bfloat16. Convert with BFloat16FromFloat32 and Float32.
type BFloat16 uint16

// Float16FromFloat32 rounds f to the nearest half-precision value (ties to
// even); values beyond the half range become ±Inf, NaN stays NaN.
func Float16FromFloat32(f float32) Float16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return Float16(sign | 0x7e00 | uint16(mant>>13)) // quiet NaN, top payload bits kept
		}
		return Float16(sign | 0x7c00)
	}
	e := exp - 127 + 15 // rebias
	if e >= 0x1f {
		return Float16(sign | 0x7c00)
	}
	if e <= 0 {
		// Subnormal half: the value in units of 2^-24 is the full significand
		// shifted right by 14-e, rounded to nearest even.
		shift := uint(14 - e)
		if shift > 24 {
			return Float16(sign) // below half the smallest subnormal
		}
		full := mant | 0x800000
		m := full >> shift
		rem := full & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || (rem == half && m&1 == 1) {
			m++ // may carry into the smallest normal, which is the right encoding
		}
		return Float16(sign | uint16(m))
	}
	h := uint32(sign) | uint32(e)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
		h++ // a carry out of the mantissa bumps the exponent, up to Inf
	}
	return Float16(h)
}

// Float32 returns h as a float32 (exactly: every half value is a float32 value).
func (h Float16) Float32() float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp == 0 && mant == 0:
		return math.Float32frombits(sign)
	case exp == 0:
		// Subnormal: normalize so the leading 1 becomes the implicit bit.
		e := uint32(127 - 15 + 1)
		for mant&0x400 == 0 {
			mant <<= 1
			e--
		}
		return math.Float32frombits(sign | e<<23 | (mant&0x3ff)<<13)
	default:
		return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
	}
}

// String formats h like a float32.
func (h Float16) String() string {
	return strconv.FormatFloat(float64(h.Float32()), 'g', -1, 32)
}

// BFloat16FromFloat32 rounds f to the nearest bfloat16 value (ties to even);
// NaN stays NaN.
func BFloat16FromFloat32(f float32) BFloat16 {
	b := math.Float32bits(f)
	if b&0x7f800000 == 0x7f800000 && b&0x7fffff != 0 {
		return BFloat16(b>>16 | 0x40) // quiet NaN, even if rounding would clear the payload
	}
	b += 0x7fff + (b>>16)&1
	return BFloat16(b >> 16)
}

// Float32 returns b as a float32 (exactly).
func (b BFloat16) Float32() float32 {
	return math.Float32frombits(uint32(b) << 16)
}

// String formats b like a float32.
func (b BFloat16) String() string {
	return strconv.FormatFloat(float64(b.Float32()), 'g', -1, 32)
}
