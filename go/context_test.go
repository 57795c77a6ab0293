package pybridge_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	pybridge "github.com/pybridge/pybridge/go"
)

// The ...Context calls (doc.go, Contexts). ctxDeadline is the deadline given to a call
// whose peer never comes; ctxReturns bounds how long after it the call must have
// returned, far below the groups' 60 s timeout (which would end it otherwise).
const (
	ctxDeadline = 300 * time.Millisecond
	ctxReturns  = 10 * time.Second
)

func init() {
	roles["ctxdone"] = roleContextDone
	roles["contexts"] = roleContexts
}

// TestContexts2Ranks: on 2 ranks, every call that waits on the other rank is given a
// deadline while the other rank never makes its side of the call. Each returns
// ErrCanceled wrapping context.DeadlineExceeded at once, its group is aborted (later
// calls on it say so, and the other rank's calls on it fail), and the world goes on.
// Before that, every ...Context call given a context already cancelled starts nothing
// (checked mode would name a collective one rank started alone).
func TestContexts2Ranks(t *testing.T) {
	p1, err := belowEphemeral()
	if err != nil {
		t.Fatal(err)
	}
	p2, err := belowEphemeral()
	for err == nil && p2 == p1 {
		p2, err = belowEphemeral()
	}
	if err != nil {
		t.Fatal(err)
	}
	files, _ := writeDataset(t, t.TempDir(), 2, 6)
	expectPass(t, runRanks(t, &launch{role: "ctxdone,contexts", world: 2, limit: 240 * time.Second,
		env: []string{"PB_TEST_PORTS=" + strconv.Itoa(p1) + "," + strconv.Itoa(p2), "PB_TEST_CTX_ONLY=" + os.Getenv("PB_TEST_CTX_ONLY"),
			"PB_TEST_CTX_FILES=" + strings.Join(files, ","), "PB_TEST_CTX_DIR=" + t.TempDir()},
		stopOnFailure: true}))
}

// InitContext ends an Init whose peers never come: rank 1 waiting for the store's
// host (rank 0), and rank 0 (the host) waiting in the roster for rank 1. Run in this
// process: nothing else is initialized here.
func TestInitContextPeerNeverArrives(t *testing.T) {
	for _, rank := range []int{1, 0} {
		port, err := belowEphemeral()
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), ctxDeadline)
		start := time.Now()
		var g *pybridge.Group
		err = within(t, 60*time.Second, "InitContext", func() (err error) {
			g, err = pybridge.InitContext(ctx, pybridge.WithInitMethod("tcp://127.0.0.1:"+strconv.Itoa(port)),
				pybridge.WithRank(rank), pybridge.WithWorldSize(2), pybridge.WithBackend("gloo"),
				pybridge.WithTimeout(60*time.Second))
			return err
		})
		cancel()
		if g != nil || !errors.Is(err, pybridge.ErrCanceled) || !errors.Is(err, context.DeadlineExceeded) ||
			time.Since(start) > ctxReturns {
			t.Fatalf("rank %d: InitContext with no peer: %v, %v after %v; want ErrCanceled (DeadlineExceeded) "+
				"within %v", rank, g, err, time.Since(start), ctxReturns)
		}
		t.Logf("rank %d: %v (after %v)", rank, err, time.Since(start).Round(time.Millisecond))
		if rank == 0 { // the store it hosted is gone with it: its port can be listened on again
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
			if err != nil {
				t.Fatalf("port %d still held after the canceled Init: %v", port, err)
			}
			l.Close()
		}
	}
}

// roleContextDone: a context already done starts nothing. Only rank 1 makes the calls;
// the world is in checked mode, so a collective that any of them started would make
// the closing AllReduce fail on both ranks (its sequence numbers would differ), or hang.
func roleContextDone() error {
	done, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	if g, err := pybridge.InitContext(done); g != nil || !canceledBy(err, context.Canceled) {
		return fmt.Errorf("InitContext with a done context: %v, %v", g, err)
	}
	if g, err := pybridge.ElasticInitContext(done); g != nil || !canceledBy(err, context.Canceled) {
		return fmt.Errorf("ElasticInitContext with a done context: %v, %v", g, err)
	}
	g, err := initRole(pybridge.WithBackend("gloo"), pybridge.WithTimeout(60*time.Second), pybridge.WithChecked())
	if err != nil {
		return err
	}
	defer g.Close()
	start = time.Now() // the calls themselves, not the world's start-up (slow under a loaded suite)
	if err := startNothing(done, g); err != nil {
		return err
	}
	if time.Since(start) > 30*time.Second { // a hang guard: nothing was started, so nothing waits
		return fmt.Errorf("the calls with a done context took %v", time.Since(start))
	}
	x := []float32{float32(g.Rank() + 1)}
	if err := pybridge.AllReduce(g, x, pybridge.Sum); err != nil || x[0] != 3 {
		return fmt.Errorf("the AllReduce after them: %v, %v (want 3)", x, err)
	}
	return nil
}

// startNothing makes every ...Context call with done, on rank 1 alone (what they work
// on is made by both ranks first).
func startNothing(done context.Context, g *pybridge.Group) error {
	data := []float32{1, 2}
	red, err := pybridge.NewReducer(g, pybridge.Params[float32](2)) // a collective
	if err != nil {
		return err
	}
	defer red.Close()
	dil, err := pybridge.NewDiLoCo(g, [][]float32{data}, 1) // a collective
	if err != nil {
		return err
	}
	defer dil.Close()
	if g.Rank() == 0 {
		return nil
	}
	files := strings.Split(os.Getenv("PB_TEST_CTX_FILES"), ",")
	l, err := pybridge.OpenLoader(g, files, 2)
	if err != nil {
		return err
	}
	defer l.Close()
	dir := filepath.Join(os.Getenv("PB_TEST_CTX_DIR"), "done")
	ck := pybridge.NewCheckpoint(g, dir)
	if err := pybridge.AddTensor(ck, "data", data); err != nil {
		return err
	}
	st, err := pybridge.NewElasticState(ck)
	if err != nil {
		return err
	}
	defer st.Close()
	avg, err := pybridge.NewAverager[float32](g, 2)
	if err != nil {
		return err
	}
	defer avg.Close()
	two := func(_ any, err error) error { return err }
	three := func(_, _ any, err error) error { return err }
	calls := map[string]error{
		"BarrierContext":                 g.BarrierContext(done),
		"AllReduceContext":               pybridge.AllReduceContext(done, g, data, pybridge.Sum),
		"BroadcastContext":               pybridge.BroadcastContext(done, g, data, 0),
		"AllGatherContext":               pybridge.AllGatherContext(done, g, data, make([]float32, 4)),
		"ReduceScatterContext":           pybridge.ReduceScatterContext(done, g, make([]float32, 4), data, pybridge.Sum),
		"SendContext":                    pybridge.SendContext(done, g, data, 0, 3),
		"RecvContext":                    pybridge.RecvContext(done, g, data, 0, 3),
		"AllReduceTensorContext":         pybridge.AllReduceTensorContext(done, g, pybridge.TensorOf(data), pybridge.Sum),
		"BroadcastTensorContext":         pybridge.BroadcastTensorContext(done, g, pybridge.TensorOf(data), 0),
		"AllGatherTensorContext":         pybridge.AllGatherTensorContext(done, g, pybridge.TensorOf(data), pybridge.TensorOf(make([]float32, 4))),
		"ReduceScatterTensorContext":     pybridge.ReduceScatterTensorContext(done, g, pybridge.TensorOf(make([]float32, 4)), pybridge.TensorOf(data), pybridge.Sum),
		"SendTensorContext":              pybridge.SendTensorContext(done, g, pybridge.TensorOf(data), 0, 3),
		"RecvTensorContext":              pybridge.RecvTensorContext(done, g, pybridge.TensorOf(data), 0, 3),
		"BroadcastParamsTensorsContext":  pybridge.BroadcastParamsTensorsContext(done, g, []pybridge.TensorSource{pybridge.TensorOf(data)}, 0),
		"BroadcastParamsContext":         pybridge.BroadcastParamsContext(done, g, [][]float32{data}, 0),
		"AverageParamsContext":           pybridge.AverageParamsContext(done, g, [][]float32{data}),
		"AnyRankContext":                 two(pybridge.AnyRankContext(done, g, true)),
		"SplitContext":                   two(g.SplitContext(done, 0, 0)),
		"SplitWithBackendContext":        two(g.SplitWithBackendContext(done, 0, 0, "gloo")),
		"SubgroupContext":                two(g.SubgroupContext(done, []int{0, 1})),
		"NodesContext":                   three(g.NodesContext(done, 1)),
		"NewReducerContext":              two(pybridge.NewReducerContext(done, g, pybridge.Params[float32](2))),
		"AttachReducerContext":           two(pybridge.AttachReducerContext(done, g, nil)),
		"Reducer.MarkReadyContext":       red.MarkReadyContext(done, 0),
		"Reducer.JoinContext":            two(red.JoinContext(done)),
		"Reducer.WaitContext":            red.WaitContext(done),
		"NewHierarchicalAveragerContext": two(pybridge.NewHierarchicalAveragerContext[float32](done, g, []pybridge.AverageLevel{{1, 2}})),
		"Averager.StepContext":           two(avg.StepContext(done, [][]float32{data})),
		"NewDiLoCoContext":               two(pybridge.NewDiLoCoContext(done, g, [][]float32{data}, 1)),
		"DiLoCo.StepContext":             two(dil.StepContext(done, [][]float32{data})),
		"OpenLoaderContext":              two(pybridge.OpenLoaderContext(done, g, files, 2, pybridge.WithPartition(pybridge.DynamicPartition))),
		"Checkpoint.SaveContext":         ck.SaveContext(done, 1),
		"Checkpoint.RestoreContext":      three(ck.RestoreContext(done)),
		"ElasticState.CommitContext":     st.CommitContext(done, 1),
		"ElasticState.SyncContext":       two(st.SyncContext(done, g, 0)),
		"ElasticState.ResetContext":      three(st.ResetContext(done)),
		"NewFedServerContext":            two(pybridge.NewFedServerContext[float32](done, g)),
		"NewFedWorkerContext":            two(pybridge.NewFedWorkerContext[float32](done, g)),
	}
	if l.NextContext(done) || !canceledBy(l.Err(), context.Canceled) {
		return fmt.Errorf("Loader.NextContext with a done context: %v", l.Err())
	}
	for name, err := range calls {
		if !canceledBy(err, context.Canceled) {
			return fmt.Errorf("%s with a done context: %v, want ErrCanceled wrapping context.Canceled", name, err)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		return fmt.Errorf("Checkpoint.SaveContext with a done context wrote %s (%v)", dir, err)
	}
	return nil
}

// canceledBy: err is ErrCanceled wrapping cause.
func canceledBy(err, cause error) bool {
	var pe *pybridge.Error
	return errors.Is(err, pybridge.ErrCanceled) && errors.Is(err, cause) && errors.As(err, &pe) && pe.Err == cause
}

// ctxCase is one call that waits on the other rank. Both ranks run setup on a fresh
// subgroup of the world; then the blocking rank makes the call with a deadline while
// the other makes none (peer, if any, is what it does before: never the call's other
// side). aborts: the call aborts its group (else, as a wait that can be given up, it
// leaves the group as it was, and after runs on both ranks).
type ctxCase struct {
	name   string
	block  int // the rank that makes the call
	setup  func(sub *pybridge.Group) (any, error)
	call   func(ctx context.Context, sub *pybridge.Group, state any) error
	peer   func(sub *pybridge.Group, state any) error
	aborts bool
	after  func(sub *pybridge.Group, state any) error
}

func roleContexts() error {
	g, err := initRole(pybridge.WithBackend("gloo"), pybridge.WithTimeout(60*time.Second))
	if err != nil {
		return err
	}
	defer g.Close()
	only := os.Getenv("PB_TEST_CTX_ONLY") // one case, by name, when debugging
	for _, c := range contextCases() {
		if only != "" && c.name != only {
			continue
		}
		if err := runCtxCase(g, c); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
	}
	return abortTheWorld(g)
}

// abortTheWorld: the world itself aborted by a deadline (rank 1's Barrier, rank 0 late):
// its later calls say so, rank 0's Barrier fails at once, and both leave it cleanly.
func abortTheWorld(g *pybridge.Group) error {
	if g.Rank() == 1 {
		ctx, cancel := context.WithTimeout(context.Background(), ctxDeadline)
		defer cancel()
		if err := g.BarrierContext(ctx); !canceledBy(err, context.DeadlineExceeded) {
			return fmt.Errorf("the world's BarrierContext with rank 0 late: %v", err)
		}
		if err := g.Barrier(); !errors.Is(err, pybridge.ErrClosed) || !strings.Contains(err.Error(), "was aborted") {
			return fmt.Errorf("a Barrier on the aborted world: %v, want ErrClosed saying it was aborted", err)
		}
	} else {
		time.Sleep(2 * ctxDeadline)
		start := time.Now()
		if err := g.Barrier(); !errors.Is(err, pybridge.ErrComm) || time.Since(start) > ctxReturns {
			return fmt.Errorf("rank 0's Barrier on the world rank 1 aborted: %v after %v, want ErrComm at once",
				err, time.Since(start))
		}
	}
	return g.Close() // and the process exits cleanly (the test checks its status)
}

func runCtxCase(g *pybridge.Group, c ctxCase) error {
	sub, err := g.Subgroup([]int{0, 1}) // a group of its own: its abort leaves the world alone
	if err != nil {
		return err
	}
	defer sub.Close()
	var state any
	if c.setup != nil {
		if state, err = c.setup(sub); err != nil {
			return fmt.Errorf("setup: %w", err)
		}
		if cl, ok := state.(interface{ Close() error }); ok {
			defer cl.Close() // on both ranks (the blocking call may have closed it: a second Close is nil)
		}
	}
	if g.Rank() == c.block {
		ctx, cancel := context.WithTimeout(context.Background(), ctxDeadline)
		start := time.Now()
		err := c.call(ctx, sub, state)
		cancel()
		took := time.Since(start)
		if !canceledBy(err, context.DeadlineExceeded) || took > ctxReturns {
			return fmt.Errorf("with no peer: %v after %v; want ErrCanceled wrapping DeadlineExceeded within %v",
				err, took, ctxReturns)
		}
		logf("%s: %v (after %v)", c.name, err, took.Round(time.Millisecond))
		if c.aborts {
			if err := pybridge.AllReduce(sub, []float32{1}, pybridge.Sum); !errors.Is(err, pybridge.ErrClosed) ||
				!strings.Contains(err.Error(), "was aborted") {
				return fmt.Errorf("a call after the abort: %v, want ErrClosed saying the group was aborted", err)
			}
		}
	} else if c.peer != nil {
		if err := c.peer(sub, state); err != nil {
			return fmt.Errorf("the peer: %w", err)
		}
	}
	if err := g.Barrier(); err != nil { // the world is untouched
		return err
	}
	if c.aborts && g.Rank() != c.block {
		// The aborted rank shut its connections: a call that needs it fails at once.
		start := time.Now()
		if err := pybridge.AllReduce(sub, []float32{1}, pybridge.Sum); err == nil || time.Since(start) > ctxReturns {
			return fmt.Errorf("the peer's call on the aborted group: %v after %v, want an error at once",
				err, time.Since(start))
		}
	}
	if !c.aborts && c.after != nil {
		if err := c.after(sub, state); err != nil {
			return fmt.Errorf("after the wait: %w", err)
		}
	}
	return g.Barrier()
}

func contextCases() []ctxCase {
	data := func() []float32 { return []float32{1, 2} }
	collective := func(name string, call func(ctx context.Context, sub *pybridge.Group) error) ctxCase {
		return ctxCase{name: name, block: 1, aborts: true,
			call: func(ctx context.Context, sub *pybridge.Group, _ any) error { return call(ctx, sub) }}
	}
	second := func(_ any, err error) error { return err }
	reducer := func(opts ...pybridge.ReducerOption) func(sub *pybridge.Group) (any, error) {
		return func(sub *pybridge.Group) (any, error) {
			return pybridge.NewReducer(sub, pybridge.Params[float32](2), opts...)
		}
	}
	fed := func(sub *pybridge.Group) (any, error) {
		if sub.Rank() == 0 {
			return pybridge.NewFedServer[float32](sub, pybridge.WithClientTimeout(60*time.Second))
		}
		return pybridge.NewFedWorker[float32](sub)
	}
	return []ctxCase{
		collective("BarrierContext", func(ctx context.Context, sub *pybridge.Group) error { return sub.BarrierContext(ctx) }),
		collective("AllReduceContext", func(ctx context.Context, sub *pybridge.Group) error {
			return pybridge.AllReduceContext(ctx, sub, data(), pybridge.Sum)
		}),
		collective("BroadcastContext", func(ctx context.Context, sub *pybridge.Group) error {
			return pybridge.BroadcastContext(ctx, sub, data(), 0)
		}),
		collective("AllGatherContext", func(ctx context.Context, sub *pybridge.Group) error {
			return pybridge.AllGatherContext(ctx, sub, data(), make([]float32, 4))
		}),
		collective("ReduceScatterContext", func(ctx context.Context, sub *pybridge.Group) error {
			return pybridge.ReduceScatterContext(ctx, sub, make([]float32, 4), data(), pybridge.Sum)
		}),
		collective("RecvContext", func(ctx context.Context, sub *pybridge.Group) error {
			return pybridge.RecvContext(ctx, sub, data(), 0, 5)
		}),
		collective("AllReduceTensorContext", func(ctx context.Context, sub *pybridge.Group) error {
			return pybridge.AllReduceTensorContext(ctx, sub, pybridge.TensorOf(data()), pybridge.Sum)
		}),
		collective("RecvTensorContext", func(ctx context.Context, sub *pybridge.Group) error {
			return pybridge.RecvTensorContext(ctx, sub, pybridge.TensorOf(data()), 0, 5)
		}),
		collective("BroadcastParamsContext", func(ctx context.Context, sub *pybridge.Group) error {
			return pybridge.BroadcastParamsContext(ctx, sub, [][]float32{data()}, 0)
		}),
		collective("BroadcastParamsTensorsContext", func(ctx context.Context, sub *pybridge.Group) error {
			return pybridge.BroadcastParamsTensorsContext(ctx, sub, []pybridge.TensorSource{pybridge.TensorOf(data())}, 0)
		}),
		collective("AverageParamsContext", func(ctx context.Context, sub *pybridge.Group) error {
			return pybridge.AverageParamsContext(ctx, sub, [][]float32{data()})
		}),
		collective("AnyRankContext", func(ctx context.Context, sub *pybridge.Group) error {
			return second(pybridge.AnyRankContext(ctx, sub, true))
		}),
		collective("SplitContext", func(ctx context.Context, sub *pybridge.Group) error {
			return second(sub.SplitContext(ctx, 0, 0))
		}),
		// The subgroup's backend waits for its other member in the store: no socket of
		// sub's ends that wait, the abort does.
		collective("SubgroupContext", func(ctx context.Context, sub *pybridge.Group) error {
			return second(sub.SubgroupContext(ctx, []int{0, 1}))
		}),
		collective("NodesContext", func(ctx context.Context, sub *pybridge.Group) error {
			_, _, err := sub.NodesContext(ctx, 1)
			return err
		}),
		collective("NewReducerContext", func(ctx context.Context, sub *pybridge.Group) error {
			return second(pybridge.NewReducerContext(ctx, sub, pybridge.Params[float32](2)))
		}),
		collective("NewHierarchicalAveragerContext", func(ctx context.Context, sub *pybridge.Group) error {
			return second(pybridge.NewHierarchicalAveragerContext[float32](ctx, sub, []pybridge.AverageLevel{{1, 1}, {2, 2}}))
		}),
		// A dynamic loader's ranks compare what they opened, through the store.
		collective("OpenLoaderContext", func(ctx context.Context, sub *pybridge.Group) error {
			return second(pybridge.OpenLoaderContext(ctx, sub, strings.Split(os.Getenv("PB_TEST_CTX_FILES"), ","), 2,
				pybridge.WithPartition(pybridge.DynamicPartition)))
		}),
		collective("Checkpoint.RestoreContext", func(ctx context.Context, sub *pybridge.Group) error {
			_, _, err := pybridge.NewCheckpoint(sub, filepath.Join(os.Getenv("PB_TEST_CTX_DIR"), "restore")).RestoreContext(ctx)
			return err
		}),
		collective("ElasticState.SyncContext", func(ctx context.Context, sub *pybridge.Group) error {
			st, err := pybridge.NewElasticState(pybridge.NewCheckpoint(sub, ""))
			if err != nil {
				return err
			}
			defer st.Close()
			return second(st.SyncContext(ctx, sub, 0))
		}),
		collective("NewFedWorkerContext", func(ctx context.Context, sub *pybridge.Group) error {
			return second(pybridge.NewFedWorkerContext[float32](ctx, sub))
		}),
		{name: "Reducer.JoinContext", block: 1, aborts: true, setup: reducer(pybridge.WithJoin()),
			call: func(ctx context.Context, _ *pybridge.Group, r any) error {
				defer r.(*pybridge.Reducer).Close()
				return second(r.(*pybridge.Reducer).JoinContext(ctx))
			}},
		// WithJoinDivideByActive: the first mark of an iteration waits for the count.
		{name: "Reducer.MarkReadyContext", block: 1, aborts: true, setup: reducer(pybridge.WithJoinDivideByActive()),
			call: func(ctx context.Context, _ *pybridge.Group, r any) error {
				defer r.(*pybridge.Reducer).Close()
				return r.(*pybridge.Reducer).MarkReadyContext(ctx, 0)
			}},
		{name: "Averager.StepContext", block: 1, aborts: true,
			setup: func(sub *pybridge.Group) (any, error) { return pybridge.NewAverager[float32](sub, 2) },
			call: func(ctx context.Context, _ *pybridge.Group, a any) error {
				defer a.(*pybridge.Averager[float32]).Close()
				return second(a.(*pybridge.Averager[float32]).StepContext(ctx, [][]float32{data()}))
			}},
		collective("NewDiLoCoContext", func(ctx context.Context, sub *pybridge.Group) error {
			return second(pybridge.NewDiLoCoContext(ctx, sub, [][]float32{data()}, 1))
		}),
		// A sync every step: the first step's average waits for the peer.
		{name: "DiLoCo.StepContext", block: 1, aborts: true,
			setup: func(sub *pybridge.Group) (any, error) { return pybridge.NewDiLoCo(sub, [][]float32{data()}, 1) },
			call: func(ctx context.Context, _ *pybridge.Group, d any) error {
				defer d.(*pybridge.DiLoCo[float32]).Close()
				return second(d.(*pybridge.DiLoCo[float32]).StepContext(ctx, [][]float32{data()}))
			}},
		// Streaming: the sync started at step 1 travels on the DiLoCo's thread and group (a
		// subgroup of sub, aborted with it); step 2 waits for it.
		{name: "DiLoCo.StepContext (delay)", block: 1, aborts: true,
			setup: func(sub *pybridge.Group) (any, error) {
				return pybridge.NewDiLoCo(sub, [][]float32{data()}, 2, pybridge.WithDelay(1))
			},
			call: func(ctx context.Context, _ *pybridge.Group, d any) error {
				dl := d.(*pybridge.DiLoCo[float32])
				defer dl.Close()
				if synced, err := dl.Step([][]float32{data()}); err != nil || synced {
					return fmt.Errorf("step 1 (the sync starts on the thread): %v, %v", synced, err)
				}
				return second(dl.StepContext(ctx, [][]float32{data()}))
			}},
		// The worker waits for a task that never comes.
		{name: "FedWorker.NextContext", block: 1, aborts: true, setup: fed,
			call: func(ctx context.Context, _ *pybridge.Group, w any) error {
				defer w.(*pybridge.FedWorker[float32]).Close()
				_, _, err := w.(*pybridge.FedWorker[float32]).NextContext(ctx)
				return err
			}},
		// The server waits for a result that never comes: rank 0 blocks here. The worker
		// takes its task (StartRound sends it the model) and never answers.
		{name: "FedServer.NextContext", block: 0, aborts: true, setup: fed,
			peer: func(_ *pybridge.Group, w any) error {
				_, ok, err := w.(*pybridge.FedWorker[float32]).Next()
				if err == nil && !ok {
					err = errors.New("no task")
				}
				return err
			},
			call: func(ctx context.Context, _ *pybridge.Group, s any) error {
				srv := s.(*pybridge.FedServer[float32])
				defer srv.Close()
				if err := srv.StartRound([]int{0}, data()); err != nil {
					return err
				}
				_, _, err := srv.NextContext(ctx)
				return err
			}},
		// A wait that can be given up: nothing is aborted, and the work completes later.
		{name: "Work.WaitContext", block: 1,
			setup: func(sub *pybridge.Group) (any, error) {
				b, err := pybridge.NewBuffer[float32](2)
				if err != nil || sub.Rank() == 0 {
					return b, err
				}
				w, err := pybridge.IRecv(sub, b, 0, 7)
				return [2]any{b, w}, err
			},
			call: func(ctx context.Context, _ *pybridge.Group, s any) error {
				return s.([2]any)[1].(*pybridge.Work).WaitContext(ctx)
			},
			after: func(sub *pybridge.Group, s any) error {
				if sub.Rank() == 0 {
					defer s.(*pybridge.Buffer[float32]).Close()
					return pybridge.Send(sub, []float32{8, 9}, 1, 7)
				}
				b, w := s.([2]any)[0].(*pybridge.Buffer[float32]), s.([2]any)[1].(*pybridge.Work)
				defer b.Close()
				defer w.Close()
				if err := w.Wait(0); err != nil || b.Data()[0] != 8 || b.Data()[1] != 9 {
					return fmt.Errorf("Wait after the peer sent: %v, %v", b.Data(), err)
				}
				return nil
			}},
	}
}
