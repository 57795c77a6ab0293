package pybridge_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	pybridge "github.com/pybridge/pybridge/go"
)

func init() { roles["observe"] = roleObserve }

const (
	observeSteps = 3
	// the first Reducer.Wait's step is the one the first StepEnd ends: no more steps
	// than the loop's
	observeEnded = observeSteps
)

// observeLoss is the loss rank r logs at step s (from 0).
func observeLoss(r, s int) float64 { return 0.5 + float64(s) + 0.125*float64(r) }

// On 2 ranks of their own (recording stays on for the rest of a process, so not in a
// shared world): with recording off every call is a no-op without an error; after
// StartObserve and Init the spans, instants, scalars, steps, collectives and the
// reducer's buckets are in each rank's trace and metrics files, read back here.
func TestObserve2Ranks(t *testing.T) {
	dir := t.TempDir()
	expectPass(t, runRanks(t, &launch{role: "observe", world: 2, limit: 120 * time.Second,
		env: []string{"PB_OBSERVE_DIR=" + dir, "PYBRIDGE_TRACE=", "PYBRIDGE_METRICS_PORT="}}))
	for r := range 2 {
		checkObserveFiles(t, dir, r)
	}
}

func roleObserve() error {
	// Off: no library call, no error.
	if pybridge.Observing() {
		return errors.New("Observing() before StartObserve and Init")
	}
	sp := pybridge.StartSpanCat("off", "no such category")
	sp.End()
	sp.End()
	pybridge.Instant("off")
	pybridge.LogScalar("off", math.NaN())
	if n, err := pybridge.StepEnd(); n != 0 || err != nil {
		return fmt.Errorf("StepEnd when off = %d, %v; want 0, nil", n, err)
	}
	if err := pybridge.WithSpan(context.Background(), "off", func(context.Context) error { return nil }); err != nil {
		return err
	}
	if err := pybridge.FlushObserve(); err != nil {
		return fmt.Errorf("FlushObserve when off: %v", err)
	}
	// Bad starts.
	err := pybridge.StartObserve("", -1)
	if err := inGo("StartObserve with nothing", err, pybridge.ErrInvalidArgument,
		"traceDir is empty and metricsPort is negative"); err != nil {
		return err
	}
	err = pybridge.StartObserve("", 70000)
	if err := inGo("StartObserve port 70000", err, pybridge.ErrInvalidArgument, "the metrics port must be 0..65535, got 70000"); err != nil {
		return err
	}

	if err := pybridge.StartObserve(os.Getenv("PB_OBSERVE_DIR"), -1); err != nil {
		return err
	}
	if pybridge.Observing() {
		return errors.New("Observing() before Init: recording starts at Init")
	}
	g, err := pybridge.Init(pybridge.WithBackend("gloo"), pybridge.WithTimeout(60*time.Second))
	if err != nil {
		return err
	}
	defer g.Close()
	if !pybridge.Observing() {
		return errors.New("not Observing() after StartObserve and Init")
	}
	rank := g.Rank()
	red, err := pybridge.NewReducer(g, pybridge.Params[float32](8))
	if err != nil {
		return err
	}
	defer red.Close()
	ctx := context.Background()
	for s := range observeSteps {
		err := pybridge.WithSpan(ctx, "train_step", func(ctx context.Context) error {
			fwd := pybridge.StartSpanCat("forward", pybridge.CatForward)
			if err := pybridge.AllReduce(g, []float32{1, 2, 3, float32(rank)}, pybridge.Sum); err != nil {
				return err
			}
			fwd.End()
			bwd := pybridge.StartSpanCat("backward", pybridge.CatCompute)
			grad, err := red.Grad(0)
			if err != nil {
				return err
			}
			for i := range grad {
				grad[i] = float32(rank + s)
			}
			if err := red.MarkReady(0); err != nil {
				return err
			}
			done := make(chan struct{}) // a span may end on another goroutine
			go func() { bwd.End(); close(done) }()
			<-done
			if err := red.Wait(30 * time.Second); err != nil {
				return err
			}
			pybridge.LogScalar("loss", observeLoss(rank, s))
			return nil
		})
		if err != nil {
			return err
		}
		n, err := pybridge.StepEnd()
		if err != nil {
			return err
		}
		if n != int64(s+1) {
			return fmt.Errorf("StepEnd after step %d = %d, want %d", s, n, s+1)
		}
	}
	pybridge.LogScalarAt("accuracy", 0.875, 7)
	pybridge.Instant("epoch_end")
	if err := g.Barrier(); err != nil {
		return err
	}
	if err := pybridge.FlushObserve(); err != nil {
		return fmt.Errorf("FlushObserve after good calls: %v", err)
	}

	// Bad input while recording: kept, reported by the next FlushObserve (the first only).
	pybridge.StartSpanCat("x", "gpu").End()
	pybridge.LogScalar("y", 1)
	err = pybridge.FlushObserve()
	if err := inGo("unknown category", err, pybridge.ErrInvalidArgument, "unknown span category 'gpu'; valid: user, compute"); err != nil {
		return err
	}
	if !strings.HasPrefix(err.Error(), "pybridge: StartSpan: ") {
		return fmt.Errorf("unknown category: %q does not name StartSpan", err)
	}
	twice := pybridge.StartSpan("twice")
	twice.End()
	twice.End()
	err = pybridge.FlushObserve()
	if err := inGo("span ended twice", err, pybridge.ErrInvalidArgument, "is not open (ended already, or never begun)"); err != nil {
		return err
	}
	pybridge.LogScalar("", 1)
	if err := inGo("empty scalar name", pybridge.FlushObserve(), pybridge.ErrInvalidArgument, "scalar name must be a non-empty string"); err != nil {
		return err
	}
	pybridge.LogScalar("nan", math.NaN())
	if err := inGo("NaN scalar", pybridge.FlushObserve(), pybridge.ErrInvalidArgument, "expected a number, got nan"); err != nil {
		return err
	}
	if err := pybridge.FlushObserve(); err != nil {
		return fmt.Errorf("FlushObserve after the errors were reported: %v", err)
	}
	if err := red.Close(); err != nil {
		return err
	}
	return g.Close() // writes the files
}

// traceEvent is the part of a Chrome trace event the test reads.
type traceEvent struct {
	Ph   string         `json:"ph"`
	Name string         `json:"name"`
	Cat  string         `json:"cat"`
	Tid  int            `json:"tid"`
	Args map[string]any `json:"args"`
}

func checkObserveFiles(t *testing.T, dir string, rank int) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank%d.trace.json", rank)))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		TraceEvents []traceEvent `json:"traceEvents"`
		OtherData   struct {
			Pybridge struct {
				Rank        int  `json:"rank"`
				WorldSize   int  `json:"world_size"`
				Steps       int  `json:"steps"`
				ClockSynced bool `json:"clock_synced"`
			} `json:"pybridge"`
		} `json:"otherData"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("rank %d's trace: %v", rank, err)
	}
	header := doc.OtherData.Pybridge
	if header.Rank != rank || header.WorldSize != 2 || header.Steps != observeEnded || !header.ClockSynced {
		t.Errorf("rank %d's trace header: %+v, want rank %d of 2, %d steps, clock synced", rank, header, rank, observeEnded)
	}
	tracks := map[int]string{}
	for _, e := range doc.TraceEvents {
		if e.Ph == "M" && e.Name == "thread_name" {
			tracks[e.Tid], _ = e.Args["name"].(string)
		}
	}
	var spans, instants []string
	var losses []float64
	var steps []int
	var seqs []int
	allReduces := 0
	for _, e := range doc.TraceEvents {
		switch {
		case e.Ph == "M":
		case tracks[e.Tid] == "program" && e.Ph == "X" && e.Name != "reducer.wait":
			spans = append(spans, e.Name+"/"+e.Cat)
		case tracks[e.Tid] == "program" && e.Ph == "i":
			instants = append(instants, e.Name+"/"+e.Cat)
		case tracks[e.Tid] == "program" && e.Ph == "C" && e.Name == "loss":
			v, _ := e.Args["loss"].(float64)
			losses = append(losses, v)
		case tracks[e.Tid] == "steps" && e.Name == "step":
			n, _ := e.Args["step"].(float64)
			steps = append(steps, int(n))
		case strings.HasPrefix(tracks[e.Tid], "collectives"):
			n, _ := e.Args["seq"].(float64)
			seqs = append(seqs, int(n))
			if e.Name == "all_reduce" {
				allReduces++
			}
		}
	}
	var want []string
	for range observeSteps {
		want = append(want, "forward/forward", "backward/compute", "train_step/user")
	}
	want = append(want, "twice/user")
	if !slices.Equal(spans, want) {
		t.Errorf("rank %d's program spans: %v, want %v", rank, spans, want)
	}
	if !slices.Equal(instants, []string{"epoch_end/user"}) {
		t.Errorf("rank %d's instants: %v", rank, instants)
	}
	var wantLoss []float64
	for s := range observeSteps {
		wantLoss = append(wantLoss, observeLoss(rank, s))
	}
	if !slices.Equal(losses, wantLoss) {
		t.Errorf("rank %d's loss counters: %v, want %v", rank, losses, wantLoss)
	}
	if len(steps) != observeEnded || steps[len(steps)-1] != observeEnded {
		t.Errorf("rank %d's steps: %v, want 1..%d", rank, steps, observeEnded)
	}
	// Collectives numbered in the order issued, none missing: each step's AllReduce and
	// the reducer's bucket (an all_reduce too), the barrier, and the library's own.
	slices.Sort(seqs)
	for i, s := range seqs {
		if s != i+1 {
			t.Fatalf("rank %d's collectives by sequence number: %v, want 1..%d", rank, seqs, len(seqs))
		}
	}
	if allReduces != 2*observeSteps {
		t.Errorf("rank %d: %d all_reduce events, want %d", rank, allReduces, 2*observeSteps)
	}

	rows, err := os.ReadFile(filepath.Join(dir, "metrics", fmt.Sprintf("rank%d.jsonl", rank)))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(rows)), "\n")
	var row struct {
		Rank, Step  int
		Scalars     map[string]float64
		Collectives map[string]struct{ Count int }
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &row); err != nil {
		t.Fatalf("rank %d's metrics: %v", rank, err)
	}
	if row.Rank != rank || row.Step != observeEnded || row.Scalars["loss"] != wantLoss[len(wantLoss)-1] ||
		row.Scalars["accuracy"] != 0.875 || row.Collectives["all_reduce"].Count != 2*observeSteps {
		t.Errorf("rank %d's last metrics row: %+v", rank, row)
	}
}

// TestObserveOff: in a process that never started recording, spans, instants, scalars
// and steps return at once (no library call: none is loaded by this test) with no error.
func TestObserveOff(t *testing.T) {
	if pybridge.Observing() {
		t.Skip("this process records")
	}
	for range 1000 {
		pybridge.StartSpanCat("forward", pybridge.CatForward).End()
		pybridge.Instant("mark")
		pybridge.LogScalar("loss", 1)
		pybridge.LogScalarAt("accuracy", 1, 3)
	}
	if n, err := pybridge.StepEnd(); n != 0 || err != nil {
		t.Fatalf("StepEnd = %d, %v; want 0, nil", n, err)
	}
	if err := pybridge.FlushObserve(); err != nil {
		t.Fatal(err)
	}
}
