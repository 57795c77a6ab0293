// Command pbdemo shows pybridge across real ranks: rank 0 broadcasts a vector
// to everyone, then all ranks sum their own vectors with AllReduce. Run it
// under a launcher, for example with two ranks:
//
//	python3 -m torch.distributed.run --standalone --nproc-per-node 2 --no-python ./pbdemo
//
// It prints each rank's results and exits non-zero if anything fails or a
// result differs from the value computed locally.
package main

import (
	"flag"
	"fmt"
	"math"
	"os"
	"time"

	pybridge "github.com/pybridge/pybridge/go"
)

func main() {
	n := flag.Int("n", 8, "vector length")
	timeout := flag.Duration("timeout", 60*time.Second, "rendezvous and collective timeout")
	flag.Parse()
	if err := run(*n, *timeout); err != nil {
		fmt.Fprintf(os.Stderr, "pbdemo: %v\n", err)
		os.Exit(1)
	}
}

func run(n int, timeout time.Duration) error {
	if n < 1 {
		return fmt.Errorf("-n must be at least 1, got %d", n)
	}
	// gloo: the vectors are Go slices in host memory.
	g, err := pybridge.Init(pybridge.WithBackend("gloo"), pybridge.WithTimeout(timeout))
	if err != nil {
		return err
	}
	defer g.Close()
	rank, size := g.Rank(), g.Size()
	say := func(format string, args ...any) {
		fmt.Printf("[rank %d/%d] %s\n", rank, size, fmt.Sprintf(format, args...))
	}
	say("joined: local rank %d, pybridge %s", g.LocalRank(), pybridge.Version())

	// Broadcast: rank 0 holds the "model weights" (sin(i)); the others start with zeros.
	weights := make([]float32, n)
	if rank == 0 {
		for i := range weights {
			weights[i] = float32(math.Sin(float64(i)))
		}
	}
	if err := pybridge.Broadcast(g, weights, 0); err != nil {
		return err
	}
	say("broadcast from rank 0: %s", format(weights))

	// AllReduce: rank r contributes (r+1)*(i+1); the sum is size*(size+1)/2*(i+1).
	grads := make([]float32, n)
	for i := range grads {
		grads[i] = float32((rank + 1) * (i + 1))
	}
	say("my vector:             %s", format(grads))
	if err := pybridge.AllReduce(g, grads, pybridge.Sum); err != nil {
		return err
	}
	say("allreduce sum:         %s", format(grads))

	bad := 0
	for i := range n {
		if weights[i] != float32(math.Sin(float64(i))) {
			bad++
		}
		if grads[i] != float32(size*(size+1)/2*(i+1)) {
			bad++
		}
	}
	if bad > 0 {
		return fmt.Errorf("rank %d: %d elements differ from the expected values", rank, bad)
	}
	if err := g.Close(); err != nil {
		return err
	}
	say("check: OK (broadcast and allreduce match the expected values on %d ranks)", size)
	return nil
}

func format(v []float32) string {
	s := "["
	for i, x := range v {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%.3g", x)
	}
	return s + "]"
}
