package pybridge_test

import (
	"math"
	"testing"

	pybridge "github.com/pybridge/pybridge/go"
)

func TestFloat16Known(t *testing.T) {
	cases := []struct {
		f    float32
		bits uint16
	}{
		{0, 0x0000},
		{float32(math.Copysign(0, -1)), 0x8000},
		{1, 0x3c00},
		{-2, 0xc000},
		{0.5, 0x3800},
		{65504, 0x7bff},                           // largest finite
		{65519, 0x7bff},                           // rounds down
		{65520, 0x7c00},                           // halfway to the next step: ties to even overflow to Inf
		{float32(math.Inf(1)), 0x7c00},            //
		{float32(math.Inf(-1)), 0xfc00},           //
		{float32(math.Ldexp(1, -14)), 0x0400},     // smallest normal
		{float32(math.Ldexp(1, -24)), 0x0001},     // smallest subnormal
		{float32(math.Ldexp(1, -25)), 0x0000},     // half of it: ties to even, 0
		{float32(math.Ldexp(1.5, -25)), 0x0001},   // above half: rounds up
		{float32(math.Ldexp(3, -25)), 0x0002},     // 1.5 units: ties to even, 2
		{float32(math.Ldexp(1023, -24)), 0x03ff},  // largest subnormal
		{float32(math.Ldexp(2047, -25)), 0x0400},  // rounds up into the normals
		{1 + float32(math.Ldexp(1, -11)), 0x3c00}, // tie, even stays
		{1 + float32(math.Ldexp(3, -11)), 0x3c02}, // tie, odd rounds up
		{1 + float32(math.Ldexp(1, -11)) + 1e-6, 0x3c01},
		{1e-10, 0x0000},
	}
	for _, c := range cases {
		if got := pybridge.Float16FromFloat32(c.f); uint16(got) != c.bits {
			t.Errorf("Float16FromFloat32(%g) = %#04x, want %#04x", c.f, uint16(got), c.bits)
		}
	}
	if h := pybridge.Float16FromFloat32(float32(math.NaN())); !math.IsNaN(float64(h.Float32())) {
		t.Errorf("NaN became %#04x", uint16(h))
	}
	if s := pybridge.Float16FromFloat32(1.5).String(); s != "1.5" {
		t.Errorf("String() = %q", s)
	}
}

// Every half value survives the trip through float32 and back.
func TestFloat16RoundTrip(t *testing.T) {
	for bits := 0; bits <= 0xffff; bits++ {
		h := pybridge.Float16(bits)
		f := h.Float32()
		if math.IsNaN(float64(f)) {
			if bits&0x7c00 != 0x7c00 || bits&0x3ff == 0 {
				t.Fatalf("%#04x decoded to NaN", bits)
			}
			continue
		}
		if back := pybridge.Float16FromFloat32(f); back != h {
			t.Fatalf("%#04x -> %g -> %#04x", bits, f, uint16(back))
		}
	}
	// Spot-check the decoding against the definition of the format.
	for bits, want := range map[uint16]float64{0x0001: math.Ldexp(1, -24), 0x03ff: math.Ldexp(1023, -24),
		0x3555: 0.333251953125, 0xc400: -4, 0x7bff: 65504} {
		if got := pybridge.Float16(bits).Float32(); float64(got) != want {
			t.Errorf("%#04x decoded to %g, want %g", bits, got, want)
		}
	}
}

func TestBFloat16(t *testing.T) {
	cases := []struct {
		f    float32
		bits uint16
	}{
		{1, 0x3f80},
		{-2, 0xc000},
		{3, 0x4040},
		{1 + float32(math.Ldexp(1, -8)), 0x3f80}, // tie, even stays
		{1 + float32(math.Ldexp(3, -8)), 0x3f82}, // tie, odd rounds up
		{1 + float32(math.Ldexp(1, -8)) + 1e-6, 0x3f81}, // above the tie
		{math.MaxFloat32, 0x7f80},                       // rounds to Inf
		{float32(math.Inf(-1)), 0xff80},                 //
		{float32(math.Ldexp(1, -133)), 0x0001},          // subnormal
	}
	for _, c := range cases {
		if got := pybridge.BFloat16FromFloat32(c.f); uint16(got) != c.bits {
			t.Errorf("BFloat16FromFloat32(%g) = %#04x, want %#04x", c.f, uint16(got), c.bits)
		}
	}
	// A NaN whose payload sits only in the low bits must not round to Inf.
	nan := math.Float32frombits(0x7f800001)
	if b := pybridge.BFloat16FromFloat32(nan); !math.IsNaN(float64(b.Float32())) {
		t.Errorf("NaN became %#04x", uint16(b))
	}
	for bits := 0; bits <= 0xffff; bits++ {
		b := pybridge.BFloat16(bits)
		if f := b.Float32(); !math.IsNaN(float64(f)) && pybridge.BFloat16FromFloat32(f) != b {
			t.Fatalf("%#04x does not round-trip", bits)
		}
	}
}
