package pybridge_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	pybridge "github.com/pybridge/pybridge/go"
)

func init() {
	roles["subgroups"] = roleSubgroups
	roles["powersgd"] = rolePowerSGD
}

func init() { world4.share("subgroups", "TestSubgroups4Ranks") }

// Four ranks: two pairs reduce at once on their own subgroups, ranks within a
// subgroup address roots and peers, nested groups, node groups, Close.
func TestSubgroups4Ranks(t *testing.T) {
	expectRolePass(t, world4, "subgroups")
}

func want(what string, got, exp any) error {
	if fmt.Sprint(got) != fmt.Sprint(exp) {
		return fmt.Errorf("%s: got %v, want %v", what, got, exp)
	}
	return nil
}

func roleSubgroups() error {
	g, err := initRole(pybridge.WithBackend("gloo"), pybridge.WithTimeout(60*time.Second))
	if err != nil {
		return err
	}
	defer g.Close()
	rank := g.Rank()
	pair, err := g.Split(rank/2, rank)
	if err != nil {
		return err
	}
	if err := want("pair ranks", pair.Ranks(), []int{rank / 2 * 2, rank/2*2 + 1}); err != nil {
		return err
	}
	x := []float64{float64(rank + 1), 1}
	if err := pybridge.AllReduce(pair, x, pybridge.Sum); err != nil {
		return err
	}
	if err := want("pair sum", x[0], float64(4*(rank/2)+3)); err != nil {
		return err
	}
	y := []int32{int32(rank)}
	if err := pybridge.Broadcast(pair, y, 1); err != nil { // group rank 1
		return err
	}
	if err := want("pair broadcast", y[0], rank/2*2+1); err != nil {
		return err
	}
	msg := []float32{float32(rank * 10)}
	if pair.Rank() == 0 {
		err = pybridge.Send(pair, msg, 1, 0)
	} else {
		err = pybridge.Recv(pair, msg, 0, 0)
	}
	if err != nil {
		return err
	}
	if err := want("point to point", msg[0], rank/2*20); err != nil {
		return err
	}
	if r, err := pair.RankOf(rank); err != nil || r != rank%2 {
		return fmt.Errorf("RankOf: %d %v", r, err)
	}
	if _, err := pair.RankOf((rank + 2) % 4); !errors.Is(err, pybridge.ErrInvalidArgument) {
		return fmt.Errorf("RankOf a non-member: %v", err)
	}
	// Nested, and a negative color.
	solo, err := pair.Split(pair.Rank(), 0)
	if err != nil || solo.Size() != 1 {
		return fmt.Errorf("nested split: %v %v", solo, err)
	}
	if none, err := g.Split(-1, 0); none != nil || err != nil {
		return fmt.Errorf("negative color: %v %v", none, err)
	}
	// A gloo copy of the world (what an nccl program uses for Go slices).
	host, err := g.SplitWithBackend(0, rank, "gloo")
	if err != nil || host.Size() != 4 || host.Rank() != rank {
		return fmt.Errorf("SplitWithBackend gloo: %v %v", host, err)
	}
	n := []int32{int32(rank)}
	if err := pybridge.AllReduce(host, n, pybridge.Sum); err != nil {
		return err
	}
	if err := want("gloo split sum", n[0], int32(6)); err != nil {
		return err
	}
	if _, err := g.SplitWithBackend(0, rank, "mpi"); !errors.Is(err, pybridge.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "unknown backend 'mpi'") {
		return fmt.Errorf("SplitWithBackend mpi: %v", err)
	}
	// Streams: nil is the current stream; a stream in a process without CUDA is refused.
	if err := host.SetStream(nil); err != nil {
		return fmt.Errorf("SetStream(nil): %v", err)
	}
	if _, err := os.Stat("/proc/driver/nvidia/version"); err != nil { // no NVIDIA driver: no CUDA
		var fake [8]byte
		if err := host.SetStream(unsafe.Pointer(&fake[0])); !errors.Is(err, pybridge.ErrInvalidArgument) ||
			!strings.Contains(err.Error(), "no CUDA device") {
			return fmt.Errorf("SetStream without CUDA: %v", err)
		}
	}
	if err := host.Close(); err != nil {
		return err
	}
	// Listed members, in the listed order: group rank 0 is global rank 3.
	sub, err := g.Subgroup([]int{3, 0})
	if err != nil {
		return err
	}
	if (sub == nil) != (rank == 1 || rank == 2) {
		return fmt.Errorf("Subgroup membership: %v", sub)
	}
	if sub != nil {
		z := []float64{float64(rank)}
		if err := pybridge.Broadcast(sub, z, 0); err != nil {
			return err
		}
		if err := want("subgroup root", z[0], 3); err != nil {
			return err
		}
		if err := sub.Close(); err != nil {
			return err
		}
		if err := sub.Barrier(); !errors.Is(err, pybridge.ErrClosed) {
			return fmt.Errorf("use after Close: %v", err)
		}
		if err := sub.Close(); err != nil {
			return fmt.Errorf("second Close: %v", err)
		}
	}
	intra, cross, err := g.Nodes(2)
	if err != nil {
		return err
	}
	if err := want("nodes", [][]int{intra.Ranks(), cross.Ranks()},
		[][]int{{rank / 2 * 2, rank/2*2 + 1}, {rank % 2, rank%2 + 2}}); err != nil {
		return err
	}
	// A reducer on the pair averages within the pair.
	red, err := pybridge.NewReducer(pair, pybridge.Params[float32](3))
	if err != nil {
		return err
	}
	grad, _ := pybridge.GradAs[float32](red, 0)
	for i := range grad {
		grad[i] = float32(rank)
	}
	if err := red.MarkReady(0); err != nil {
		return err
	}
	if err := red.Wait(30 * time.Second); err != nil {
		return err
	}
	grad, _ = pybridge.GradAs[float32](red, 0)
	if err := want("reducer on a pair", grad[0], float32(rank/2*2)+0.5); err != nil {
		return err
	}
	red.Close()
	if err := g.Barrier(); err != nil {
		return err
	}
	if err := g.Close(); err != nil {
		return err
	}
	if err := pair.Barrier(); !errors.Is(err, pybridge.ErrClosed) {
		return fmt.Errorf("subgroup after the world closed: %v", err)
	}
	return nil
}

// The Go reducer with PowerSGD gives what pybridge's Python reducer gives with
// torch's own powerSGD_hook, on the same gradients (tests/powersgd_reference.py).
func TestPowerSGDMatchesTorchHook(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not found")
	}
	ref, err := exec.Command(python, filepath.Join("..", "tests", "powersgd_reference.py")).Output()
	if err != nil {
		t.Fatalf("reference run: %v", err)
	}
	procs := runRanks(t, &launch{role: "powersgd", world: 2, limit: 120 * time.Second})
	expectPass(t, procs)
	type result struct {
		Rank  int
		Grads [][][]float64
	}
	parse := func(text, prefix string) map[int]result {
		out := map[int]result{}
		for _, line := range strings.Split(text, "\n") {
			if rest, ok := strings.CutPrefix(line, prefix); ok && strings.HasPrefix(rest, "{") {
				var r result
				if err := json.Unmarshal([]byte(rest), &r); err != nil {
					t.Fatal(err)
				}
				out[r.Rank] = r
			}
		}
		return out
	}
	want := parse(string(ref), "")
	for _, p := range procs {
		for rank, got := range parse(p.out.String(), "POWERSGD ") {
			exp := want[rank]
			if len(got.Grads) != 4 || len(exp.Grads) != 4 {
				t.Fatalf("rank %d: %d and %d iterations", rank, len(got.Grads), len(exp.Grads))
			}
			worst, moved := 0.0, 0.0
			for it := range got.Grads {
				for i := range got.Grads[it] {
					for j, v := range got.Grads[it][i] {
						worst = math.Max(worst, math.Abs(v-exp.Grads[it][i][j]))
						plain := (math.Sin(0.013*float64((j+1)*(j+1))+float64(it)+3*float64(i)) +
							math.Sin(0.013*float64((j+1)*(j+1))+float64(it)+7+3*float64(i))) / 2
						moved = math.Max(moved, math.Abs(v-plain)) // PowerSGD's differs from the plain mean
					}
				}
			}
			if worst > 1e-5 || moved < 1e-3 {
				t.Fatalf("rank %d: max difference from torch's hook %g (moved %g)", rank, worst, moved)
			}
		}
	}
}

func rolePowerSGD() error {
	g, err := pybridge.Init(pybridge.WithBackend("gloo"), pybridge.WithTimeout(60*time.Second))
	if err != nil {
		return err
	}
	defer g.Close()
	shapes := [][]int{{16, 12}, {16}, {4, 16}}
	specs := make([]pybridge.ParamSpec, len(shapes))
	for i, s := range shapes {
		n := 1
		for _, d := range s {
			n *= d
		}
		specs[i] = pybridge.ParamSpec{Len: n, DType: pybridge.DTypeOf[float32](), Shape: slices.Clone(s)}
	}
	red, err := pybridge.NewReducer(g, specs, pybridge.WithPowerSGD(2, true))
	if err != nil {
		return err
	}
	defer red.Close()
	var out [][][]float64
	for it := 0; it < 4; it++ {
		for i := range specs {
			grad, err := pybridge.GradAs[float32](red, i)
			if err != nil {
				return err
			}
			for j := range grad {
				grad[j] = float32(math.Sin(0.013*float64((j+1)*(j+1)) + float64(it) + 7*float64(g.Rank()) + 3*float64(i)))
			}
			if err := red.MarkReady(i); err != nil {
				return err
			}
		}
		if err := red.Wait(30 * time.Second); err != nil {
			return err
		}
		var iter [][]float64
		for i := range specs {
			grad, _ := pybridge.GradAs[float32](red, i)
			row := make([]float64, len(grad))
			for j, v := range grad {
				row[j] = float64(v)
			}
			iter = append(iter, row)
		}
		out = append(out, iter)
	}
	line, _ := json.Marshal(map[string]any{"Rank": g.Rank(), "Grads": out})
	fmt.Fprintf(os.Stdout, "POWERSGD %s\n", line)
	return nil
}

func init() {
	roles["gossip"] = roleGossip
	world4.share("gossip", "TestGossipReducer4Ranks")
}

// The Go reducer with GossipGraD on 4 ranks: mixing to the mean within a period,
// nodes of two ranks, and sync_every's exact steps.
func TestGossipReducer4Ranks(t *testing.T) {
	expectRolePass(t, world4, "gossip")
}

// gossipSteps runs the reducer for len(feed) steps; feed(step, last) gives the
// gradient value; it returns each step's result.
func gossipSteps(g *pybridge.Group, opt pybridge.ReducerOption, steps int, feed func(step int, last float32) float32) ([]float32, error) {
	red, err := pybridge.NewReducer(g, pybridge.Params[float32](8), opt)
	if err != nil {
		return nil, err
	}
	defer red.Close()
	var out []float32
	last := float32(g.Rank())
	for s := 0; s < steps; s++ {
		grad, err := pybridge.GradAs[float32](red, 0)
		if err != nil {
			return nil, err
		}
		for i := range grad {
			grad[i] = feed(s, last)
		}
		if err := red.MarkReady(0); err != nil {
			return nil, err
		}
		if err := red.Wait(30 * time.Second); err != nil {
			return nil, err
		}
		grad, _ = pybridge.GradAs[float32](red, 0)
		last = grad[0]
		out = append(out, last)
	}
	return out, nil
}

// gossipSyncAllBuckets: with three buckets and sync every 2, step 0 gossips
// (a pair's average) and step 1 averages every bucket exactly, not only the last.
// Ranks hold rank^2 (+10 per bucket): no pair's average equals the mean, 3.5.
func gossipSyncAllBuckets(g *pybridge.Group) error {
	red, err := pybridge.NewReducer(g, pybridge.Params[float32](8, 8, 8), pybridge.WithBucketCapMB(1e-6),
		pybridge.WithoutRebuild(), pybridge.WithGossip(pybridge.GossipCube, 1, 7, 2))
	if err != nil {
		return err
	}
	defer red.Close()
	for s := 0; s < 2; s++ {
		for b := 0; b < 3; b++ {
			grad, err := pybridge.GradAs[float32](red, b)
			if err != nil {
				return err
			}
			for i := range grad {
				grad[i] = float32(g.Rank()*g.Rank() + 10*b)
			}
			if err := red.MarkReady(b); err != nil {
				return err
			}
		}
		if err := red.Wait(30 * time.Second); err != nil {
			return err
		}
		for b := 0; b < 3; b++ {
			grad, _ := pybridge.GradAs[float32](red, b)
			mean := 3.5 + float32(10*b)
			if (s == 1) != (grad[0] == mean) {
				return fmt.Errorf("sync every 2, step %d, bucket %d: %v (the exact mean is %v only at step 1)", s, b, grad[0], mean)
			}
		}
	}
	return nil
}

func roleGossip() error {
	g, err := initRole(pybridge.WithBackend("gloo"), pybridge.WithTimeout(60*time.Second))
	if err != nil {
		return err
	}
	defer g.Close()
	rank := float32(g.Rank())
	// Mixing: each step feeds back the last result; 4 nodes mix exactly in 2 steps.
	for _, topo := range []pybridge.GossipTopology{pybridge.GossipCube, pybridge.GossipDissemination} {
		got, err := gossipSteps(g, pybridge.WithGossip(topo, 1, 7, 0), 2, func(_ int, last float32) float32 { return last })
		if err != nil {
			return err
		}
		if math.Abs(float64(got[1])-1.5) > 1e-6 {
			return fmt.Errorf("topology %d: after 2 steps %v, want 1.5", topo, got)
		}
	}
	// Nodes of two ranks: node averages 0.5 and 2.5, exchanged in one step.
	got, err := gossipSteps(g, pybridge.WithGossip(pybridge.GossipCube, 2, 0, 0), 1, func(int, float32) float32 { return rank })
	if err != nil {
		return err
	}
	if got[0] != 1.5 {
		return fmt.Errorf("nodes of two: %v, want 1.5", got)
	}
	// sync every 3: steps 0 and 1 mix with one peer, step 2 is the exact mean.
	got, err = gossipSteps(g, pybridge.WithGossip(pybridge.GossipCube, 1, 7, 3), 3, func(int, float32) float32 { return rank })
	if err != nil {
		return err
	}
	if got[2] != 1.5 || got[0] == 1.5 {
		return fmt.Errorf("sync every 3: %v, want a pair average then 1.5 at step 2", got)
	}
	if err := gossipSyncAllBuckets(g); err != nil {
		return err
	}
	if _, err := pybridge.NewReducer(g, pybridge.Params[float32](8), pybridge.WithGossip(7, 1, 0, 0)); !errors.Is(err, pybridge.ErrInvalidArgument) {
		return fmt.Errorf("unknown topology: %v", err)
	}
	return g.Barrier()
}
