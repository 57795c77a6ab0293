package pybridge_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	pybridge "github.com/pybridge/pybridge/go"
)

func init() { roles["cudatensors"] = roleCUDATensors }

// cudaDevices is the number of CUDA devices torch sees here (0 without a GPU or
// with a CPU build of torch). PB_TEST_CUDA, when set, is taken as the answer.
func cudaDevices() int {
	if v := os.Getenv("PB_TEST_CUDA"); v != "" {
		n, _ := strconv.Atoi(v)
		return n
	}
	if _, err := os.Stat("/proc/driver/nvidia/version"); err != nil {
		return 0 // no NVIDIA driver: no need to start Python to know
	}
	out, err := exec.Command("python3", "-c", "import torch; print(torch.cuda.device_count())").Output()
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	return n
}

// Device memory through the Go package, one rank under nccl: the reducer's
// buckets on the GPU handed out as device Tensors, every collective (sync and
// async) on them, bad device descriptors named, a gloo split for Go slices.
// Skipped without CUDA; tests/test_cuda.py runs it where a GPU is.
func TestCUDATensors(t *testing.T) {
	if cudaDevices() < 1 {
		t.Skip("needs a CUDA GPU")
	}
	expectPass(t, runRanks(t, &launch{role: "cudatensors", world: 1, limit: 120 * time.Second}))
}

func roleCUDATensors() error {
	g, err := pybridge.Init(pybridge.WithBackend("nccl"), pybridge.WithTimeout(60*time.Second))
	if err != nil {
		return err
	}
	defer g.Close()
	if g.Device() != 0 {
		return fmt.Errorf("Device() = %d under nccl, want 0", g.Device())
	}
	red, err := pybridge.NewReducer(g, pybridge.Params[float32](5, 3))
	if err != nil {
		return err
	}
	defer red.Close()
	grad, err := red.GradTensor(0)
	if err != nil {
		return err
	}
	if grad.Device != 0 || grad.Len != 5 || grad.Data == nil {
		return fmt.Errorf("GradTensor on the GPU: %+v", grad)
	}
	if _, err := pybridge.GradAs[float32](red, 0); !errors.Is(err, pybridge.ErrInvalidArgument) {
		return fmt.Errorf("a Go slice over device memory: %v", err)
	}
	if err := pybridge.AllReduceTensor(g, grad, pybridge.Sum); err != nil {
		return err
	}
	if err := pybridge.BroadcastTensor(g, grad, 0); err != nil {
		return err
	}
	w, err := pybridge.AllReduceTensorAsync(g, grad, pybridge.Avg)
	if err != nil {
		return err
	}
	if err := w.Wait(30 * time.Second); err != nil {
		return err
	}
	for i := 0; i < 2; i++ {
		if err := red.MarkReady(i); err != nil {
			return err
		}
	}
	if err := red.Wait(30 * time.Second); err != nil {
		return err
	}
	bad := grad
	bad.Device = 99
	if err := pybridge.AllReduceTensor(g, bad, pybridge.Sum); !errors.Is(err, pybridge.ErrInvalidArgument) ||
		!strings.Contains(strings.ToLower(err.Error()), "device 99") {
		return fmt.Errorf("a device index the process lacks: %v", err)
	}
	if err := pybridge.AllReduce(g, []float32{1}, pybridge.Sum); !errors.Is(err, pybridge.ErrInvalidArgument) {
		return fmt.Errorf("a Go slice under nccl: %v", err)
	}
	host, err := g.SplitWithBackend(0, 0, "gloo")
	if err != nil {
		return err
	}
	x := []float32{2}
	if err := pybridge.AllReduce(host, x, pybridge.Sum); err != nil || x[0] != 2 {
		return fmt.Errorf("Go slices on the gloo split: %v %v", x, err)
	}
	if err := g.SetStream(nil); err != nil {
		return err
	}
	return host.Close()
}
