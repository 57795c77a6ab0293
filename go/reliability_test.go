package pybridge_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	pybridge "github.com/pybridge/pybridge/go"
)

func init() {
	roles["mismatch"] = roleMismatch
	roles["worldsize"] = roleWorldSize
	roles["late"] = roleLate
}

func init() { world2.share("mismatch", "TestCheckedModeMismatches") }

// TestCheckedModeMismatches: in checked mode, ranks passing different dtypes, ops,
// counts or roots (and a send and a recv of different counts) all get
// ErrInvalidArgument naming the rank that differs; no rank aborts and the group stays
// usable. BroadcastParams with different tensors is refused in every mode.
func TestCheckedModeMismatches(t *testing.T) {
	expectRolePass(t, world2, "mismatch")
}

func roleMismatch() error {
	g, err := initRole(pybridge.WithBackend("gloo"), pybridge.WithTimeout(30*time.Second),
		pybridge.WithChecked())
	if err != nil {
		return err
	}
	defer g.Close()
	odd := g.Rank() == 1
	want := func(what string, err error, text string) error {
		if !errors.Is(err, pybridge.ErrInvalidArgument) || !strings.Contains(err.Error(), text) {
			return fmt.Errorf("%s: got %v, want ErrInvalidArgument containing %q", what, err, text)
		}
		logf("%s: %v", what, err)
		return nil
	}
	if odd {
		err = pybridge.AllReduce(g, make([]int32, 4), pybridge.Sum)
	} else {
		err = pybridge.AllReduce(g, make([]float32, 4), pybridge.Sum)
	}
	if err := want("dtype", err, "rank 1 passed all_reduce #1 (sum) int32 x 4 (dtype differs)"); err != nil {
		return err
	}
	op := pybridge.Sum
	if odd {
		op = pybridge.Max
	}
	if err := want("op", pybridge.AllReduce(g, make([]float32, 4), op), "(max) float32 x 4 (op or root differs)"); err != nil {
		return err
	}
	n := 4
	if odd {
		n = 5
	}
	if err := want("count", pybridge.AllReduce(g, make([]float32, n), pybridge.Sum), "float32 x 5 (count differs)"); err != nil {
		return err
	}
	if odd {
		err = pybridge.Recv(g, make([]float32, 3), 0, 0)
	} else {
		err = pybridge.Send(g, make([]float32, 4), 1, 0)
	}
	if err := want("send/recv", err, "rank 0 sends float32 x 4, rank 1 receives float32 x 3"); err != nil {
		return err
	}
	params := [][]float32{make([]float32, 3)}
	if odd {
		params = append(params, make([]float32, 2))
	}
	err = pybridge.BroadcastParams(g, params, 0)
	if err := want("broadcast params", err, "rank 1 pass 2 tensors (root 0)"); err != nil {
		return err
	}
	if pe := (*pybridge.Error)(nil); !errors.As(err, &pe) || !strings.HasPrefix(pe.Msg, "ranks pass different tensors") {
		return fmt.Errorf("broadcast params: %v does not start with what is wrong (Op names BroadcastParams)", err)
	}
	if err := concurrentAllReduces(g); err != nil {
		return err
	}
	sum := []float32{float32(g.Rank() + 1)}
	if err := pybridge.AllReduce(g, sum, pybridge.Sum); err != nil || sum[0] != 3 {
		return fmt.Errorf("all_reduce after the refusals: %v %v", sum, err)
	}
	return nil
}

// concurrentAllReduces: 8 goroutines per rank each reduce a slice of their own length on
// one group, in whatever order the scheduler runs them (issue 32: a rank aborted in
// default mode, and checked mode hung). In checked mode every call either sums right or
// is named as a mismatch; none hangs and none aborts.
func concurrentAllReduces(g *pybridge.Group) error {
	errs := make([]error, 8)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := make([]float32, i+1)
			for j := range x {
				x[j] = 1
			}
			err := pybridge.AllReduce(g, x, pybridge.Sum)
			switch {
			case err == nil && x[0] != 2:
				errs[i] = fmt.Errorf("goroutine %d: sum %v, want 2", i, x[0])
			case err != nil && (!errors.Is(err, pybridge.ErrInvalidArgument) ||
				!strings.Contains(err.Error(), "checked mode: ranks disagree on all_reduce #")):
				errs[i] = fmt.Errorf("goroutine %d: %v, want a sum or a named mismatch", i, err)
			case err != nil:
				logf("goroutine %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// TestWorldSizeDisagreement: rank 0 says 2 ranks, rank 1 says 3: both fail.
func TestWorldSizeDisagreement(t *testing.T) {
	procs := runRanks(t, &launch{role: "worldsize", world: 2, limit: 90 * time.Second})
	expectPass(t, procs)
}

func roleWorldSize() error {
	size := 2
	if os.Getenv("RANK") == "1" {
		size = 3
	}
	g, err := pybridge.Init(pybridge.WithBackend("gloo"), pybridge.WithTimeout(20*time.Second),
		pybridge.WithWorldSize(size))
	if err == nil {
		g.Close()
		return errors.New("Init succeeded although the ranks disagree on the world size")
	}
	if !errors.Is(err, pybridge.ErrInvalidArgument) || !strings.Contains(err.Error(), "ranks disagree on the world size") {
		return fmt.Errorf("got %v, want ErrInvalidArgument naming the world sizes", err)
	}
	logf("Init: %v", err)
	return nil
}

// TestWatchdogNamesTheLateRank: rank 1 reaches its second AllReduce 4 s late; with a
// 1 s watchdog rank 0 reports on stderr, before the timeout, that rank 1 never started it.
func TestWatchdogNamesTheLateRank(t *testing.T) {
	procs := runRanks(t, &launch{role: "late", world: 2, limit: 90 * time.Second})
	expectPass(t, procs)
	out := procs[0].out.String()
	for _, want := range []string{"pybridge watchdog on rank 0 (host ", "all_reduce #2 (4 bytes) on the world group",
		"ranks [1] never started all_reduce #2", "ranks [0] started all_reduce #2 but have not finished"} {
		if !strings.Contains(out, want) {
			t.Fatalf("rank 0's output lacks %q\n%s", want, dump(procs))
		}
	}
}

func roleLate() error {
	g, err := pybridge.Init(pybridge.WithBackend("gloo"), pybridge.WithTimeout(30*time.Second),
		pybridge.WithWatchdog(time.Second))
	if err != nil {
		return err
	}
	defer g.Close()
	data := []float32{1}
	if err := pybridge.AllReduce(g, data, pybridge.Sum); err != nil {
		return err
	}
	if g.Rank() == 1 {
		time.Sleep(4 * time.Second)
	}
	return pybridge.AllReduce(g, data, pybridge.Sum)
}
