package pybridge_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	pybridge "github.com/pybridge/pybridge/go"
)

func init() { roles["join"] = roleJoin }

// joinCases: batches per rank (5, 8 and 11, uneven) and the divisor, by world size.
var joinCases = map[int][]struct {
	counts   []int
	byActive bool
}{
	2: {{[]int{5, 8}, false}, {[]int{11, 5}, true}},
	3: {{[]int{5, 8, 11}, false}, {[]int{8, 11, 5}, true}},
}

// joinBatch is rank r's k-th batch of case c: 3 samples of its own.
func joinBatch(c, r, k int) []sample {
	rng := rand.New(rand.NewSource(int64(1000*c + 100*r + k)))
	out := make([]sample, 3)
	for i := range out {
		for j := range out[i].x {
			out[i].x[j] = rng.Float64()*2 - 1
		}
		out[i].y = rng.Float64()
	}
	return out
}

// joinReference is torch DDP + Join's result, computed in one process in
// float64 without the library: in iteration t the ranks with more than t
// batches contribute their gradients, the joined ones zeros, and the sum is
// divided by the world size or by the ranks still training.
func joinReference(c int, counts []int, byActive bool) [][]float64 {
	init := initParams(1)
	p := make([][]float64, len(init))
	for i, v := range init {
		p[i] = make([]float64, len(v))
		for j := range v {
			p[i][j] = float64(v[j])
		}
	}
	longest := 0
	for _, n := range counts {
		longest = max(longest, n)
	}
	for t := 0; t < longest; t++ {
		sum := make([][]float64, len(p))
		for i := range p {
			sum[i] = make([]float64, len(p[i]))
		}
		active := 0
		for r, n := range counts {
			if t >= n {
				continue
			}
			active++
			g := make([][]float64, len(p))
			for i := range p {
				g[i] = make([]float64, len(p[i]))
			}
			backward(p, joinBatch(c, r, t), func(i int) []float64 { return g[i] }, func(int) {})
			for i := range g {
				for j := range g[i] {
					sum[i][j] += g[i][j]
				}
			}
		}
		div := float64(len(counts))
		if byActive {
			div = float64(active)
		}
		for i := range p {
			for j := range p[i] {
				p[i][j] -= lr * sum[i][j] / div
			}
		}
	}
	return p
}

func roleJoin() error {
	g, err := pybridge.Init(pybridge.WithBackend("gloo"), pybridge.WithTimeout(60*time.Second))
	if err != nil {
		return err
	}
	defer g.Close()
	rank, world := g.Rank(), g.Size()
	for c, tc := range joinCases[world] {
		params := initParams(int64(rank) + 1)
		if err := pybridge.BroadcastParams(g, params, 0); err != nil {
			return err
		}
		opt := pybridge.WithJoin()
		if tc.byActive {
			opt = pybridge.WithJoinDivideByActive()
		}
		r, err := pybridge.NewReducer(g, pybridge.Params[float32](mlpLens...), pybridge.WithBucketCapMB(1e-5), opt)
		if err != nil {
			return err
		}
		var markErr error
		for k := 0; k < tc.counts[rank]; k++ {
			backward(params, joinBatch(c, rank, k),
				func(i int) []float32 {
					v, err := r.Grad(i)
					markErr = errors.Join(markErr, err)
					return v
				},
				func(i int) { markErr = errors.Join(markErr, r.MarkReady(i)) })
			if markErr != nil {
				return markErr
			}
			if err := r.Wait(20 * time.Second); err != nil {
				return err
			}
			for i := range params {
				grad, err := r.Grad(i)
				if err != nil {
					return err
				}
				sgd(params[i], grad)
			}
		}
		res, err := r.Join()
		if err != nil {
			return err
		}
		longest := max(tc.counts[0], tc.counts[1], tc.counts[len(tc.counts)-1])
		if want := int64(longest - tc.counts[rank]); res.Shadowed != want {
			return fmt.Errorf("case %d: Join shadowed %d iterations, want %d", c, res.Shadowed, want)
		}
		if err := pybridge.BroadcastParams(g, params, res.Root); err != nil {
			return err
		}
		want := joinReference(c, tc.counts, tc.byActive)
		worst := 0.0
		for i := range params {
			for j := range params[i] {
				worst = max(worst, math.Abs(float64(params[i][j])-want[i][j]))
			}
		}
		logf("case %d %v: max |Go + Join - reference| %.3g", c, tc.counts, worst)
		if worst > 1e-6 {
			return fmt.Errorf("case %d: weights differ from the reference by %.3g (> 1e-6)", c, worst)
		}
		if err := r.Close(); err != nil {
			return err
		}
	}

	// A reducer without WithJoin cannot join.
	r, err := pybridge.NewReducer(g, pybridge.Params[float32](3))
	if err != nil {
		return err
	}
	if _, err := r.Join(); !errors.Is(err, pybridge.ErrInvalidArgument) || !strings.Contains(err.Error(), "WithJoin") {
		return fmt.Errorf("Join without WithJoin: got %v, want ErrInvalidArgument naming WithJoin", err)
	}
	r.Close()

	// The dynamic partition (rank 0 slowed): each rank joins when its loader has
	// no more batches, and every record is read once per epoch.
	r, err = pybridge.NewReducer(g, pybridge.Params[float32](2), pybridge.WithJoin())
	if err != nil {
		return err
	}
	defer r.Close()
	l, err := pybridge.OpenLoader(g, strings.Split(os.Getenv("PB_TEST_FILES"), ","), 2,
		pybridge.WithPartition(pybridge.DynamicPartition), pybridge.WithPrefetch(0))
	if err != nil {
		return err
	}
	defer l.Close()
	for epoch := 0; epoch < 2; epoch++ {
		if err := l.SetEpoch(epoch); err != nil {
			return err
		}
		var mine []string
		for l.Next() {
			if rank == 0 {
				time.Sleep(10 * time.Millisecond)
			}
			for _, rec := range l.Batch().Records() {
				mine = append(mine, string(rec))
			}
			if err := r.MarkReady(0); err != nil {
				return err
			}
			if err := r.Wait(0); err != nil {
				return err
			}
		}
		if err := l.Err(); err != nil {
			return err
		}
		if _, err := r.Join(); err != nil {
			return err
		}
		fmt.Printf("epoch %d rank %d read %d records %s\n", epoch, rank, len(mine), strings.Join(mine, " "))
	}
	return g.Close()
}

func testJoin(t *testing.T, world int) {
	files, all := writeDataset(t, t.TempDir(), 2, 30)
	procs := runRanks(t, &launch{role: "join", world: world, limit: 120 * time.Second,
		env: []string{"PB_TEST_FILES=" + strings.Join(files, ",")}})
	expectPass(t, procs)
	for epoch := 0; epoch < 2; epoch++ {
		var got []string
		var counts []int
		for _, p := range procs {
			for _, line := range strings.Split(p.out.String(), "\n") {
				var e, rk, n int
				if _, err := fmt.Sscanf(line, "epoch %d rank %d read %d", &e, &rk, &n); err != nil || e != epoch {
					continue
				}
				counts = append(counts, n)
				if i := strings.Index(line, "records "); i >= 0 {
					got = append(got, strings.Fields(line[i+len("records "):])...)
				}
			}
		}
		sort.Strings(got)
		want := append([]string(nil), all...)
		sort.Strings(want)
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Fatalf("epoch %d: records read %v, want each of %v once", epoch, got, want)
		}
		t.Logf("epoch %d: records per rank %v", epoch, counts)
	}
}

func TestJoin2Ranks(t *testing.T) { testJoin(t, 2) }

func TestJoin3Ranks(t *testing.T) { testJoin(t, 3) }
