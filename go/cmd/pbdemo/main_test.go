package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// With PBDEMO_AS_RANK set the test binary is the demo itself, so the test can
// run it as two real ranks without building it separately.
func TestMain(m *testing.M) {
	if os.Getenv("PBDEMO_AS_RANK") != "" {
		os.Args = []string{"pbdemo", "-n", "5"}
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestDemoTwoRanks(t *testing.T) {
	low, high := 20000, 31999 // below the ephemeral range, as pybridge.base.netif.free_port
	if _, err := fmt.Sscanf(os.Getenv("PYBRIDGE_PORTS"), "%d-%d", &low, &high); err != nil {
		low, high = 20000, 31999 // unset: the default range
	}
	port := 0
	for port == 0 {
		p := low + rand.IntN(high-low+1)
		if l, err := net.Listen("tcp", ":"+strconv.Itoa(p)); err == nil {
			l.Close()
			port = p
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	outs := make([]bytes.Buffer, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "PBDEMO_AS_RANK=1", "RANK="+strconv.Itoa(r), "WORLD_SIZE=2",
			"LOCAL_RANK="+strconv.Itoa(r), "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port))
		cmd.Stdout, cmd.Stderr = &outs[r], &outs[r]
		cmd.WaitDelay = 5 * time.Second
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = cmd.Wait()
		}()
	}
	wg.Wait()
	all := "rank 0:\n" + outs[0].String() + "rank 1:\n" + outs[1].String()
	if ctx.Err() != nil {
		t.Fatalf("demo ranks still running after 90s, killed\n%s", all)
	}
	for r := range 2 {
		want := "[rank " + strconv.Itoa(r) + "/2] check: OK"
		if errs[r] != nil || !strings.Contains(outs[r].String(), want) {
			t.Fatalf("rank %d: %v, want %q in its output\n%s", r, errs[r], want, all)
		}
	}
	if !strings.Contains(outs[1].String(), "allreduce sum:         [3 6 9 12 15]") {
		t.Fatalf("unexpected allreduce result\n%s", all)
	}
	t.Logf("\n%s", all)
}
