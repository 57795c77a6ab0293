package pybridge_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	pybridge "github.com/pybridge/pybridge/go"
)

// TestHostKeepsSignals: after the bridge (and its embedded Python) is loaded,
// SIGTERM and SIGINT still reach the Go program's own signal.Notify.
func TestHostKeepsSignals(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = rankEnv("signals", 0, 1, freePort(t), nil)
	out := &lockedBuffer{}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = out
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Send each signal once the child has shown it is ready for it.
	send := map[string]syscall.Signal{
		"ready":          syscall.SIGTERM,
		"got terminated": syscall.SIGINT,
	}
	lines := bufio.NewScanner(io.TeeReader(stdout, out))
	for lines.Scan() {
		line := strings.TrimPrefix(lines.Text(), "rank 0: ")
		if sig, ok := send[line]; ok {
			if err := cmd.Process.Signal(sig); err != nil {
				t.Errorf("signal %v: %v", sig, err)
			}
		}
	}
	err = cmd.Wait()
	if ctx.Err() != nil {
		t.Fatalf("child still running after 90s, killed\n%s", out)
	}
	if err != nil || !strings.Contains(out.String(), "got interrupt") {
		t.Fatalf("child: %v\n%s", err, out)
	}
	t.Logf("\n%s", out)
}

func roleSignals() error {
	g, err := pybridge.Init(pybridge.WithRank(0), pybridge.WithWorldSize(1),
		pybridge.WithInitMethod("tcp://127.0.0.1:"+os.Getenv("MASTER_PORT")))
	if err != nil {
		return err
	}
	defer g.Close()
	// Use the bridge before and after Notify so that whatever it sets up lazily is in place.
	if err := pybridge.AllReduce(g, []float32{1}, pybridge.Sum); err != nil {
		return err
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	if err := g.Barrier(); err != nil {
		return err
	}
	logf("ready")
	for range 2 {
		select {
		case s := <-sigs:
			logf("got %v", s)
		case <-time.After(30 * time.Second):
			return fmt.Errorf("no signal within 30s")
		}
	}
	return g.Close()
}
