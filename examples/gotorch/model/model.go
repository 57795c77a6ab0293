// Package model is the GoTorch-style trainer's model: the MNIST MLP held by libtorch
// (mlp.cpp, through the C interface mlp.h), reached from Go with cgo. It knows nothing of
// pybridge beyond handing out its tensors as pybridge.TorchTensor handles.
package model

/*
#cgo CXXFLAGS: -std=c++20 -D_GLIBCXX_USE_CXX11_ABI=1 -O2
#cgo LDFLAGS: -ltorch -ltorch_cpu -lc10 -lstdc++
#include "mlp.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"github.com/pybridge/pybridge/examples/mnist/mnistdata"
	pybridge "github.com/pybridge/pybridge/go"
)

// Model is the MNIST MLP held by libtorch (mlp.cpp): its parameters, gradients
// and momentum live in libtorch memory, and forward, backward and the SGD step
// run there. Go only drives it.
type Model struct {
	m      *C.mlp
	device int // pybridge.CPU or a CUDA index
}

// call runs one mlp_* function and, on failure, returns its message prefixed by op.
// mlp_last_error is thread-local and a goroutine may move to another OS thread
// between two cgo calls, so the thread stays locked from the call to the read.
func call(op string, f func() C.int) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if f() == 0 {
		return nil
	}
	return fmt.Errorf("%s: %s", op, C.GoString(C.mlp_last_error()))
}

// NewModel creates the 784-hidden-10 MLP with torch.nn.Linear's initialisation
// after torch.manual_seed(seed), on device (-1 CPU, k CUDA device k).
func NewModel(hidden int, seed int64, device int) (*Model, error) {
	var m *C.mlp
	if err := call("NewModel", func() C.int {
		return C.mlp_new(C.int32_t(mnistdata.ImageSize), C.int32_t(hidden), C.int32_t(mnistdata.NumClasses), C.int64_t(seed),
			C.int32_t(device), &m)
	}); err != nil {
		return nil, err
	}
	return &Model{m: m, device: device}, nil
}

// Close frees the model.
func (md *Model) Close() {
	if md.m != nil {
		C.mlp_free(md.m)
		md.m = nil
	}
}

// NumParams is 4: w1, b1, w2, b2.
func (md *Model) NumParams() int { return int(C.mlp_nparams(md.m)) }

// Device is where the model lives: pybridge.CPU or a CUDA device index.
func (md *Model) Device() int { return md.device }

// Param returns parameter i's memory (libtorch's), element count and shape.
func (md *Model) Param(i int) (unsafe.Pointer, int, []int, error) {
	var data unsafe.Pointer
	var count C.int64_t
	var ndim C.int32_t
	var dims [2]C.int64_t
	if err := call("Param", func() C.int {
		return C.mlp_param(md.m, C.int32_t(i), &data, &count, &ndim, &dims[0])
	}); err != nil {
		return nil, 0, nil, err
	}
	shape := make([]int, int(ndim))
	for d := range shape {
		shape[d] = int(dims[d])
	}
	return data, int(count), shape, nil
}

// HostCopy copies parameter i, or its momentum buffer, into a new Go slice
// (from the GPU too); a momentum buffer is nil before the first step.
func (md *Model) HostCopy(i int, momentum bool) ([]float32, error) {
	_, n, _, err := md.Param(i)
	if err != nil {
		return nil, err
	}
	out := make([]float32, n) // libtorch writes it during the call only (cgo's rule)
	var which, defined C.int32_t
	if momentum {
		which = 1
	}
	if err := call("HostCopy", func() C.int {
		return C.mlp_copy_to_host(md.m, C.int32_t(i), which, (*C.float)(unsafe.Pointer(&out[0])), &defined)
	}); err != nil {
		return nil, err
	}
	if defined == 0 {
		return nil, nil
	}
	return out, nil
}

// GradPointer returns where parameter i's gradient lives (nil if it has none).
func (md *Model) GradPointer(i int) (unsafe.Pointer, error) {
	var data unsafe.Pointer
	if err := call("GradPointer", func() C.int {
		return C.mlp_grad(md.m, C.int32_t(i), &data)
	}); err != nil {
		return nil, err
	}
	return data, nil
}

// ParamHandle names parameter i by handle, libtorch's own tensor (an
// at::Tensor* the model owns), for pybridge: AttachReducer and every collective
// read its dtype, device and memory from libtorch.
func (md *Model) ParamHandle(i int) (pybridge.Tensor, error) {
	var h unsafe.Pointer
	err := call("ParamHandle", func() C.int { return C.mlp_param_handle(md.m, C.int32_t(i), &h) })
	return pybridge.TorchTensor(h), err
}

// GradHandle names parameter i's gradient by handle (an error while it has none).
func (md *Model) GradHandle(i int) (pybridge.Tensor, error) {
	var h unsafe.Pointer
	if err := call("GradHandle", func() C.int { return C.mlp_grad_handle(md.m, C.int32_t(i), &h) }); err != nil {
		return pybridge.Tensor{}, err
	}
	if h == nil {
		return pybridge.Tensor{}, fmt.Errorf("GradHandle: parameter %d has no gradient", i)
	}
	return pybridge.TorchTensor(h), nil
}

// ZeroGrad drops every gradient (libtorch's zero_grad, set_to_none): the next
// backward makes fresh ones.
func (md *Model) ZeroGrad() error {
	if err := call("ZeroGrad", func() C.int {
		return C.mlp_zero_grad(md.m)
	}); err != nil {
		return err
	}
	return nil
}

// ForwardBackward runs the batch (n records: pixels n*784 bytes, labels n bytes)
// forward and backward; it returns the mean loss and the right predictions.
func (md *Model) ForwardBackward(pixels, labels []byte) (float32, int, error) {
	n := len(labels)
	if n == 0 || len(pixels) != n*mnistdata.ImageSize {
		return 0, 0, errors.New("ForwardBackward: empty batch or pixels of the wrong size")
	}
	var loss C.float
	var correct C.int32_t
	if err := call("ForwardBackward", func() C.int {
		return C.mlp_forward_backward(md.m, (*C.uint8_t)(&pixels[0]), (*C.uint8_t)(&labels[0]), C.int32_t(n),
			&loss, &correct)
	}); err != nil {
		return 0, 0, err
	}
	return float32(loss), int(correct), nil
}

// Evaluate returns the number of right predictions on a batch.
func (md *Model) Evaluate(pixels, labels []byte) (int, error) {
	n := len(labels)
	if n == 0 {
		return 0, nil
	}
	var correct C.int32_t
	if err := call("Evaluate", func() C.int {
		return C.mlp_evaluate(md.m, (*C.uint8_t)(&pixels[0]), (*C.uint8_t)(&labels[0]), C.int32_t(n), &correct)
	}); err != nil {
		return 0, err
	}
	return int(correct), nil
}

// Synchronize waits for the work queued on the model's GPU (a no-op on CPU):
// for timings, since CUDA calls return before their kernels finish.
func (md *Model) Synchronize() error {
	if err := call("Synchronize", func() C.int {
		return C.mlp_synchronize(md.m)
	}); err != nil {
		return err
	}
	return nil
}

// Step applies SGD with torch's momentum to every parameter that has a gradient.
func (md *Model) Step(lr, momentum float32) error {
	if err := call("Step", func() C.int {
		return C.mlp_sgd_step(md.m, C.float(lr), C.float(momentum))
	}); err != nil {
		return err
	}
	return nil
}
