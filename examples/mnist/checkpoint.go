package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"

	"github.com/pybridge/pybridge/examples/mnist/mnistdata"
)

// The checkpoint file shared with train.py (see mnist_format.py): magic, epochs and
// steps completed, then 8 float32 tensors with their shapes: w1, b1, w2, b2 and
// their SGD momentum buffers. Little-endian; written atomically by rank 0.
var checkpointMagic = mnistdata.Magic

type checkpoint struct {
	epoch, step uint64
	tensors     [8][]float32
}

func shapesOf(m *MLP) [8][]int {
	h := m.Hidden
	base := [4][]int{{h, imageSize}, {h}, {numClasses, h}, {numClasses}}
	var all [8][]int
	for i := range all {
		all[i] = base[i%4]
	}
	return all
}

func writeCheckpoint(path string, epoch, step int, m *MLP, opt *SGD) error {
	tensors := append([][]float32{}, m.Params()...)
	for i, p := range m.Params() {
		if opt != nil && opt.bufs != nil {
			tensors = append(tensors, opt.bufs[i])
		} else {
			tensors = append(tensors, make([]float32, len(p)))
		}
	}
	shapes := shapesOf(m)
	return mnistdata.WriteWeights(path, epoch, step, shapes[:], tensors)
}

func readCheckpoint(path string) (*checkpoint, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%s: not a usable checkpoint: %s", path, fmt.Sprintf(format, a...))
	}
	if len(raw) < 28 || !bytes.Equal(raw[:8], checkpointMagic) {
		return nil, bad("bad magic")
	}
	ck := &checkpoint{epoch: binary.LittleEndian.Uint64(raw[8:]), step: binary.LittleEndian.Uint64(raw[16:])}
	if n := binary.LittleEndian.Uint32(raw[24:]); n != 8 {
		return nil, bad("%d tensors, want 8", n)
	}
	pos := 28
	want := shapesOf(&MLP{Hidden: hidden})
	for i := range ck.tensors {
		if pos+4 > len(raw) {
			return nil, bad("truncated")
		}
		ndim := int(binary.LittleEndian.Uint32(raw[pos:]))
		pos += 4
		if ndim != len(want[i]) || pos+4*ndim > len(raw) {
			return nil, bad("tensor %d has %d dimensions, want %d", i, ndim, len(want[i]))
		}
		count := 1
		for d := 0; d < ndim; d++ {
			dim := binary.LittleEndian.Uint32(raw[pos:])
			if int(dim) != want[i][d] {
				return nil, bad("tensor %d dimension %d is %d, want %d", i, d, dim, want[i][d])
			}
			count *= int(dim)
			pos += 4
		}
		if pos+4*count > len(raw) {
			return nil, bad("truncated in tensor %d", i)
		}
		t := make([]float32, count)
		for k := range t {
			t[k] = math.Float32frombits(binary.LittleEndian.Uint32(raw[pos+4*k:]))
		}
		ck.tensors[i] = t
		pos += 4 * count
	}
	if pos != len(raw) {
		return nil, bad("%d trailing bytes", len(raw)-pos)
	}
	return ck, nil
}

// loadInto copies the parameters into m and, when opt is given, the momentum buffers.
func (ck *checkpoint) loadInto(m *MLP, opt *SGD) {
	for i, p := range m.Params() {
		copy(p, ck.tensors[i])
	}
	if opt != nil {
		opt.bufs = make([][]float32, 4)
		for i := range opt.bufs {
			opt.bufs[i] = append([]float32(nil), ck.tensors[4+i]...)
		}
	}
}
