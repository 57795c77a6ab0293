package pybridge_test

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	pybridge "github.com/pybridge/pybridge/go"
)

func init() {
	roles["local-sgd"] = roleLocalSGD
	world4.share("local-sgd", "TestHierarchicalAndLocalSGD4Ranks")
}

// On 4 ranks pretending to be 2 nodes of 2: the hierarchical hook gives the
// mean (also on a half wire), another node size is refused on every rank, and
// AverageParams, the periodic Averager's schedule and the hierarchical
// Averager's levels give numbers computed here.
func TestHierarchicalAndLocalSGD4Ranks(t *testing.T) {
	expectRolePass(t, world4, "local-sgd")
}

func roleLocalSGD() error {
	g, err := initRole(pybridge.WithBackend("gloo"), pybridge.WithTimeout(60*time.Second))
	if err != nil {
		return err
	}
	defer g.Close()
	rank, world := g.Rank(), g.Size()
	mean := func(f func(r int) float64) float64 {
		s := 0.0
		for r := 0; r < world; r++ {
			s += f(r)
		}
		return s / float64(world)
	}
	value := func(r, i int) float64 { return float64(r+1)*0.25 + float64(i)/7 }
	for _, c := range []struct {
		name string
		tol  float64
		opts []pybridge.ReducerOption
	}{
		{"hierarchical", 1e-6, []pybridge.ReducerOption{pybridge.WithHierarchical(2)}},
		{"hierarchical fp16", 2e-3, []pybridge.ReducerOption{pybridge.WithHierarchical(2),
			pybridge.WithHierarchicalCompression(pybridge.CompressFP16)}},
	} {
		red, err := pybridge.NewReducer(g, pybridge.Params[float32](50), c.opts...)
		if err != nil {
			return fmt.Errorf("%s: %v", c.name, err)
		}
		grad, _ := red.Grad(0)
		for i := range grad {
			grad[i] = float32(value(rank, i))
		}
		if err := red.MarkReady(0); err != nil {
			return err
		}
		if err := red.Wait(30 * time.Second); err != nil {
			return err
		}
		grad, _ = red.Grad(0)
		for i, v := range grad {
			want := mean(func(r int) float64 { return value(r, i) })
			if math.Abs(float64(v)-want) > c.tol {
				return fmt.Errorf("%s: gradient[%d] = %v, want %v", c.name, i, v, want)
			}
		}
		red.Close()
	}
	per := 2
	if rank >= 2 {
		per = 4
	}
	if red, err := pybridge.NewReducer(g, pybridge.Params[float32](8), pybridge.WithHierarchical(per)); err == nil {
		red.Close()
		return errors.New("another node size on ranks 2 and 3 was accepted")
	} else if !errors.Is(err, pybridge.ErrInvalidArgument) || !strings.Contains(err.Error(), "ranks_per_node 4") {
		return fmt.Errorf("another node size: %v, want ErrInvalidArgument naming ranks_per_node 4", err)
	}
	if _, err := pybridge.NewReducer(g, pybridge.Params[float32](8), pybridge.WithHook(pybridge.HookFP16),
		pybridge.WithHierarchicalCompression(pybridge.CompressBF16)); !errors.Is(err, pybridge.ErrInvalidArgument) {
		return fmt.Errorf("a wire type with the fp16 hook: %v, want ErrInvalidArgument", err)
	}

	params := [][]float64{{float64(rank), 1}, {2 * float64(rank)}}
	if err := pybridge.AverageParams(g, params); err != nil {
		return err
	}
	m := mean(func(r int) float64 { return float64(r) })
	if params[0][0] != m || params[0][1] != 1 || params[1][0] != 2*m {
		return fmt.Errorf("AverageParams: %v, want [[%v 1] [%v]]", params, m, 2*m)
	}

	// Warm-up 1, period 2: steps 1 and 3 average; x drifts by rank + step between them.
	avg, err := pybridge.NewAverager[float32](g, 2, pybridge.WithWarmupSteps(1))
	if err != nil {
		return err
	}
	x := []float32{0}
	local := make([]float64, world) // every rank's x, replayed here
	for step := 0; step < 5; step++ {
		x[0] += float32(rank + step)
		for r := range local {
			local[r] += float64(r + step)
		}
		did, err := avg.Step([][]float32{x})
		if err != nil {
			return err
		}
		if did != (step == 1 || step == 3) {
			return fmt.Errorf("step %d: averaged %v", step, did)
		}
		if did {
			m := mean(func(r int) float64 { return local[r] })
			for r := range local {
				local[r] = m
			}
		}
	}
	if math.Abs(float64(x[0])-local[rank]) > 1e-5 {
		return fmt.Errorf("averager: x = %v, want %v", x[0], local[rank])
	}
	if n, err := avg.Steps(); err != nil || n != 5 {
		return fmt.Errorf("Steps() = %d, %v; want 5", n, err)
	}
	if err := avg.Close(); err != nil {
		return err
	}
	if err := avg.Close(); err != nil {
		return fmt.Errorf("second Close: %v", err)
	}
	if _, err := avg.Step([][]float32{x}); !errors.Is(err, pybridge.ErrClosed) {
		return fmt.Errorf("Step after Close: %v, want ErrClosed", err)
	}
	if _, err := pybridge.NewAverager[float32](g, 0); !errors.Is(err, pybridge.ErrInvalidArgument) {
		return fmt.Errorf("period 0: %v, want ErrInvalidArgument", err)
	}

	// Pairs every step, all four every 2nd: step 0 averages over all, step 1 within pairs.
	h, err := pybridge.NewHierarchicalAverager[float32](g, []pybridge.AverageLevel{{1, 2}, {2, world}})
	if err != nil {
		return err
	}
	defer h.Close()
	y := [][]float32{{float32(rank)}}
	if _, err := h.Step(y); err != nil || y[0][0] != 1.5 {
		return fmt.Errorf("hierarchical step 0: %v, %v; want 1.5", y[0][0], err)
	}
	y[0][0] = float32(rank)
	pair := float32(rank/2*2) + 0.5
	if _, err := h.Step(y); err != nil || y[0][0] != pair {
		return fmt.Errorf("hierarchical step 1: %v, %v; want %v", y[0][0], err, pair)
	}
	return g.Barrier()
}
