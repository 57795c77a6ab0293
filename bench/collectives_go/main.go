// Command collectives_go is the Go side of bench/collectives.py: it times
// AllReduce and Broadcast through the C ABI, on a Go slice and as a Tensor, with
// the same cases as the Python ranks and writes rank 0's time for every timed call as JSON (per case, a list
// of samples, each a list of call times in seconds).
//
// Usage (as each of 2 ranks, with the launcher environment set):
//
//	collectives_go OUT.json CASES.json
//
// CASES is a JSON list of [kind, op, bytes, calls per sample, samples].
package main

import (
	"encoding/json"
	"fmt"
	"log"
	"os"
	"time"

	pybridge "github.com/pybridge/pybridge/go"
)

func main() {
	if len(os.Args) != 3 {
		log.Fatalf("usage: %s OUT.json CASES.json", os.Args[0])
	}
	var cases [][5]any
	if err := json.Unmarshal([]byte(os.Args[2]), &cases); err != nil {
		log.Fatalf("bad cases: %v", err)
	}
	rounds := 0
	for _, c := range cases {
		rounds = max(rounds, int(c[4].(float64)))
	}
	g, err := pybridge.Init(pybridge.WithBackend("gloo"), pybridge.WithTimeout(120*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close()
	results := map[string][][]float64{}
	// One buffer per case, reused by every sample, as a training loop reuses its
	// tensors (and as the Python ranks do): no timing then follows the allocation
	// of up to 64 MiB, nor shares the process with its garbage.
	buffers := make([][]float32, len(cases))
	for r := 0; r < rounds; r++ {
		for i, c := range cases {
			if r >= int(c[4].(float64)) {
				continue
			}
			op := c[1].(string)
			nbytes := int(c[2].(float64))
			iters := int(c[3].(float64))
			if buffers[i] == nil {
				buffers[i] = make([]float32, nbytes/4)
			}
			data := buffers[i]
			for j := range data {
				data[j] = 1
			}
			// The same call on a Go slice and as a Tensor (what a program holding
			// libtorch memory passes), timed in turns.
			tensor := pybridge.TensorOf(data)
			variants := []struct {
				impl string
				call func() error
			}{
				{"pybridge-go", func() error { return pybridge.AllReduce(g, data, pybridge.Sum) }},
				{"pybridge-go-tensor", func() error { return pybridge.AllReduceTensor(g, tensor, pybridge.Sum) }},
			}
			if op == "broadcast" {
				variants[0].call = func() error { return pybridge.Broadcast(g, data, 0) }
				variants[1].call = func() error { return pybridge.BroadcastTensor(g, tensor, 0) }
			}
			for _, v := range variants {
				for i := 0; i < max(1, iters/10); i++ { // warm-up
					must(v.call())
				}
				must(g.Barrier())
				calls := make([]float64, iters)
				for j := range calls {
					start := time.Now()
					must(v.call())
					calls[j] = time.Since(start).Seconds()
				}
				key := fmt.Sprintf("%s|%s|%d", v.impl, op, nbytes)
				results[key] = append(results[key], calls)
			}
		}
	}
	if g.Rank() == 0 {
		out, _ := json.Marshal(results)
		if err := os.WriteFile(os.Args[1], out, 0o644); err != nil {
			log.Fatal(err)
		}
	}
}

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
