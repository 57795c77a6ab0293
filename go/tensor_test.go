package pybridge_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unsafe"

	pybridge "github.com/pybridge/pybridge/go"
)

func init() {
	roles["tensors"] = roleTensors
	world2.share("tensors", "TestTensors2Ranks")
}

// Tensors the program owns, in every collective, sync and async, on 2 ranks;
// bad descriptors refused naming the field; a reducer's gradient as a Tensor.
func TestTensors2Ranks(t *testing.T) {
	expectRolePass(t, world2, "tensors")
}

// foreign is memory outside Go's heap (a library Buffer's) described as a
// Tensor, as a libtorch tensor's storage would be.
func foreign(n int) (*pybridge.Buffer[float32], pybridge.Tensor, error) {
	b, err := pybridge.NewBuffer[float32](n)
	if err != nil {
		return nil, pybridge.Tensor{}, err
	}
	return b, b.Tensor(), nil
}

func roleTensors() error {
	g, err := initRole(pybridge.WithBackend("gloo"), pybridge.WithTimeout(60*time.Second))
	if err != nil {
		return err
	}
	defer g.Close()
	me, n := g.Rank(), g.Size()
	// Synchronous calls on Go memory and on foreign memory, in place.
	x := []float64{float64(me + 1), 10}
	if err := pybridge.AllReduceTensor(g, pybridge.TensorOf(x), pybridge.Sum); err != nil {
		return err
	}
	if x[0] != 3 || x[1] != 20 {
		return fmt.Errorf("AllReduceTensor on a Go slice gave %v", x)
	}
	b, t, err := foreign(4)
	if err != nil {
		return err
	}
	defer b.Close()
	for i := range b.Data() {
		b.Data()[i] = float32(me*10 + i)
	}
	if err := pybridge.BroadcastTensor(g, t, 1); err != nil {
		return err
	}
	if got := b.Data(); got[0] != 10 || got[3] != 13 {
		return fmt.Errorf("BroadcastTensor gave %v", got)
	}
	all := make([]int32, 2*n)
	if err := pybridge.AllGatherTensor(g, pybridge.TensorOf([]int32{int32(me), int32(me)}), pybridge.TensorOf(all)); err != nil {
		return err
	}
	if all[0] != 0 || all[2] != 1 {
		return fmt.Errorf("AllGatherTensor gave %v", all)
	}
	part := make([]float32, 2)
	if err := pybridge.ReduceScatterTensor(g, pybridge.TensorOf([]float32{1, 2, 3, 4}), pybridge.TensorOf(part), pybridge.Sum); err != nil {
		return err
	}
	if want := float32(2 * (2*me + 1)); part[0] != want {
		return fmt.Errorf("ReduceScatterTensor gave %v, want %g first", part, want)
	}
	if me == 0 {
		err = pybridge.SendTensor(g, pybridge.TensorOf([]int64{7, 8}), 1, 3)
	} else {
		got := make([]int64, 2)
		if err = pybridge.RecvTensor(g, pybridge.TensorOf(got), 0, 3); err == nil && got[1] != 8 {
			err = fmt.Errorf("RecvTensor got %v", got)
		}
	}
	if err != nil {
		return err
	}
	// Asynchronous calls keep the pointer: foreign memory works, Go memory is refused.
	for i := range b.Data() {
		b.Data()[i] = float32(me + 1)
	}
	w, err := pybridge.AllReduceTensorAsync(g, t, pybridge.Avg)
	if err != nil {
		return err
	}
	if err := w.Wait(0); err != nil {
		return err
	}
	w.Close()
	if got := b.Data(); got[2] != 1.5 {
		return fmt.Errorf("AllReduceTensorAsync gave %v, want 1.5", got)
	}
	peer := 1 - me
	r, rt, err := foreign(4)
	if err != nil {
		return err
	}
	defer r.Close()
	ws, err := pybridge.ISendTensor(g, t, peer, 5)
	if err != nil {
		return err
	}
	wr, err := pybridge.IRecvTensor(g, rt, peer, 5)
	if err != nil {
		return err
	}
	if err := errors.Join(ws.Wait(0), wr.Wait(0)); err != nil {
		return err
	}
	if got := r.Data(); got[0] != 1.5 || got[3] != 1.5 {
		return fmt.Errorf("IRecvTensor got %v, want the peer's 1.5s", got)
	}
	if _, err := pybridge.AllReduceTensorAsync(g, pybridge.TensorOf(x), pybridge.Sum); !errors.Is(err, pybridge.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "Go memory") {
		return fmt.Errorf("async on a Go slice: got %v, want ErrInvalidArgument naming Go memory", err)
	}
	// Bad descriptors, each named (checked before anything is sent, so no rank waits).
	bad := []struct {
		t     pybridge.Tensor
		words string
	}{
		{pybridge.Tensor{Len: 3, DType: pybridge.DTypeFloat32, Device: pybridge.CPU}, "nil Data with Len 3"},
		{pybridge.Tensor{Data: t.Data, Len: -1, DType: pybridge.DTypeFloat32, Device: pybridge.CPU}, "negative Len"},
		{pybridge.Tensor{Data: t.Data, Len: 1, DType: 42, Device: pybridge.CPU}, "unknown DType 42"},
		{pybridge.Tensor{Data: t.Data, Len: 1, DType: pybridge.DTypeFloat32, Device: -2}, "Device -2"},
		{pybridge.Tensor{Data: t.Data, Len: 1, DType: pybridge.DTypeFloat32, Device: 7}, "CUDA device 7"},
		{pybridge.TorchTensor(nil), "nil libtorch tensor handle"},
	}
	for _, c := range bad {
		err := pybridge.AllReduceTensor(g, c.t, pybridge.Sum)
		if !errors.Is(err, pybridge.ErrInvalidArgument) || !strings.Contains(err.Error(), c.words) {
			return fmt.Errorf("%+v: got %v, want ErrInvalidArgument with %q", c.t, err, c.words)
		}
	}
	// The reducer attaches to libtorch tensors only (tests/test_gotorch.py and the C++ tests
	// attach to real ones); raw memory is named, and so is the option on NewReducer.
	if _, err := pybridge.AttachReducer(g, []pybridge.TensorSource{t}); !errors.Is(err, pybridge.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "params[0] is not a libtorch tensor handle (dtype 0, not TorchTensor)") {
		return fmt.Errorf("AttachReducer on raw memory: got %v", err)
	}
	if _, err := pybridge.NewReducer(g, pybridge.Params[float32](3), pybridge.WithGradAsBucketView()); !errors.Is(err, pybridge.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "WithGradAsBucketView goes with AttachReducer") {
		return fmt.Errorf("NewReducer with WithGradAsBucketView: got %v", err)
	}
	if err := pybridge.AllReduceTensor(g, nil, pybridge.Sum); !errors.Is(err, pybridge.ErrInvalidArgument) {
		return fmt.Errorf("nil TensorSource: got %v", err)
	}
	// BroadcastParamsTensors, and a reducer's gradient as a Tensor over its bucket.
	p0, p1 := []float32{float32(me), 1}, []float64{float64(me)}
	if err := pybridge.BroadcastParamsTensors(g, []pybridge.TensorSource{pybridge.TensorOf(p0), pybridge.TensorOf(p1)}, 1); err != nil {
		return err
	}
	if p0[0] != 1 || p1[0] != 1 {
		return fmt.Errorf("BroadcastParamsTensors gave %v %v", p0, p1)
	}
	red, err := pybridge.NewReducer(g, pybridge.Params[float32](3, 5))
	if err != nil {
		return err
	}
	defer red.Close()
	for i := 0; i < 2; i++ {
		gt, err := red.GradTensor(i)
		if err != nil {
			return err
		}
		s, _ := red.Grad(i)
		if gt.Data != unsafe.Pointer(&s[0]) || gt.Len != len(s) || gt.DType != pybridge.DTypeFloat32 || gt.Device != pybridge.CPU {
			return fmt.Errorf("GradTensor(%d) = %+v, not the bucket view at %p", i, gt, &s[0])
		}
	}
	// The program's own gradients, bound: copied in at MarkReady, averaged back at Wait.
	gb, gt0, err := foreign(3)
	if err != nil {
		return err
	}
	defer gb.Close()
	hb, gt1, err := foreign(5)
	if err != nil {
		return err
	}
	defer hb.Close()
	if err := red.BindGrads([]pybridge.TensorSource{pybridge.TensorOf(make([]float32, 3)), gt1}); !errors.Is(err, pybridge.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "grads[0]") {
		return fmt.Errorf("BindGrads of Go memory: got %v, want ErrInvalidArgument naming grads[0]", err)
	}
	if err := red.BindGrads([]pybridge.TensorSource{gt1, gt0}); !errors.Is(err, pybridge.ErrInvalidArgument) {
		return fmt.Errorf("BindGrads with lengths swapped: got %v, want ErrInvalidArgument", err)
	}
	if err := red.BindGrads([]pybridge.TensorSource{gt0, gt1}); err != nil {
		return err
	}
	for step := 0; step < 2; step++ { // the second step runs on the rebuilt buckets, if any
		for _, d := range [][]float32{gb.Data(), hb.Data()} {
			for k := range d {
				d[k] = float32((me + 1) * (k + 1 + step))
			}
		}
		for i := 1; i >= 0; i-- { // as backward produces them: last first
			if err := red.MarkReady(i); err != nil {
				return err
			}
		}
		if err := red.Wait(0); err != nil {
			return err
		}
		for _, d := range [][]float32{gb.Data(), hb.Data()} {
			for k, v := range d {
				if want := 1.5 * float32(k+1+step); v != want {
					return fmt.Errorf("step %d: bound gradient holds %v, want the average %g at %d", step, d, want, k)
				}
			}
		}
	}
	if err := red.BindGrads(nil); err != nil {
		return err
	}
	if red.CHandle() == nil {
		return errors.New("CHandle of an open reducer is nil")
	}
	red.Close()
	if red.CHandle() != nil {
		return errors.New("CHandle of a closed reducer is not nil")
	}
	return nil
}
