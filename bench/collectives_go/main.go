// Command collectives_go is the Go side of bench/collectives.py: it times
// AllReduce and Broadcast through the C ABI, one sample at a time, when told to.
//
// Usage (as each of 2 ranks, with the launcher environment set):
//
//	collectives_go CASES.json
//
// CASES is a JSON list of [kind, op, bytes, calls per sample, samples, warm-up
// calls per sample]. Each line
// "IMPL INDEX" on stdin times one sample of case INDEX and answers
// "sample SECONDS" (seconds per call) on stdout; "quit" or end of input exits.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	pybridge "github.com/pybridge/pybridge/go"
)

func main() {
	if len(os.Args) != 2 {
		log.Fatalf("usage: %s CASES.json", os.Args[0])
	}
	var cases [][6]any
	if err := json.Unmarshal([]byte(os.Args[1]), &cases); err != nil {
		log.Fatalf("bad cases: %v", err)
	}
	g, err := pybridge.Init(pybridge.WithBackend("gloo"), pybridge.WithTimeout(120*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close()
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		line := strings.TrimSpace(in.Text())
		if line == "quit" {
			break
		}
		var impl string
		var index int
		if _, err := fmt.Sscan(line, &impl, &index); err != nil || index < 0 || index >= len(cases) {
			log.Fatalf("bad command %q", line)
		}
		c := cases[index]
		fmt.Printf("sample %g\n", sample(g, c[1].(string), int(c[2].(float64)), int(c[3].(float64)), int(c[5].(float64))))
	}
}

// sample times iters calls of op on a buffer of nbytes, after warmup calls and a
// barrier, and returns the seconds per call.
func sample(g *pybridge.Group, op string, nbytes, iters, warmup int) float64 {
	data := make([]float32, nbytes/4)
	for i := range data {
		data[i] = 1
	}
	call := func() error { return pybridge.AllReduce(g, data, pybridge.Sum) }
	if op == "broadcast" {
		call = func() error { return pybridge.Broadcast(g, data, 0) }
	}
	for i := 0; i < warmup; i++ {
		must(call())
	}
	must(g.Barrier())
	start := time.Now()
	for i := 0; i < iters; i++ {
		must(call())
	}
	return time.Since(start).Seconds() / float64(iters)
}

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
