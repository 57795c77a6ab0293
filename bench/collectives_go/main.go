// Command collectives_go is the Go side of bench/collectives.py: it times
// AllReduce and Broadcast through the C ABI with the same cases as the Python
// ranks and writes rank 0's timings as JSON.
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
	results := map[string][]float64{}
	for r := 0; r < rounds; r++ {
		for _, c := range cases {
			if r >= int(c[4].(float64)) {
				continue
			}
			op := c[1].(string)
			nbytes := int(c[2].(float64))
			iters := int(c[3].(float64))
			data := make([]float32, nbytes/4)
			for i := range data {
				data[i] = 1
			}
			call := func() error { return pybridge.AllReduce(g, data, pybridge.Sum) }
			if op == "broadcast" {
				call = func() error { return pybridge.Broadcast(g, data, 0) }
			}
			for i := 0; i < max(1, iters/10); i++ { // warm-up
				must(call())
			}
			must(g.Barrier())
			start := time.Now()
			for i := 0; i < iters; i++ {
				must(call())
			}
			elapsed := time.Since(start).Seconds() / float64(iters)
			key := fmt.Sprintf("pybridge-go|%s|%d", op, nbytes)
			results[key] = append(results[key], elapsed)
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
