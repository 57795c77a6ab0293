package pybridge_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	pybridge "github.com/pybridge/pybridge/go"
)

// Types defined over built-in ones, to cover the ~ in Numeric.
type celsius float32
type tick int64

func init() { world2.share("collectives", "TestCollectives2Ranks") }

func TestCollectives2Ranks(t *testing.T) {
	expectRolePass(t, world2, "collectives")
}

func init() { world4.share("collectives", "TestCollectives4Ranks") }

func TestCollectives4Ranks(t *testing.T) {
	if testing.Short() {
		t.Skip("4 ranks in -short mode")
	}
	expectRolePass(t, world4, "collectives")
}

func roleCollectives() error {
	g, err := initRole(pybridge.WithBackend("gloo"), pybridge.WithTimeout(60*time.Second))
	if err != nil {
		return err
	}
	defer g.Close()
	f64 := func(v float64) float64 { return v }
	checks := []error{
		checkAll(g, "float32", func(v float64) float32 { return float32(v) }, true),
		checkAll(g, "float64", f64, true),
		checkAll(g, "float16", func(v float64) pybridge.Float16 { return pybridge.Float16FromFloat32(float32(v)) }, true),
		checkAll(g, "bfloat16", func(v float64) pybridge.BFloat16 { return pybridge.BFloat16FromFloat32(float32(v)) }, true),
		checkAll(g, "int8", func(v float64) int8 { return int8(v) }, false),
		checkAll(g, "uint8", func(v float64) uint8 { return uint8(v) }, false),
		checkAll(g, "int32", func(v float64) int32 { return int32(v) }, false),
		checkAll(g, "int64", func(v float64) int64 { return int64(v) }, false),
		checkAll(g, "celsius(~float32)", func(v float64) celsius { return celsius(v) }, true),
		checkAll(g, "tick(~int64)", func(v float64) tick { return tick(v) }, false),
		checkInPlace(g),
	}
	for _, err := range checks {
		if err != nil {
			return err
		}
	}
	return g.Close()
}

// value is rank r's element i. The values are small enough that sums,
// products (3^4 = 81) and averages are exact in every type, int8 included.
func value(r, i int) float64 { return float64((r+i)%3 + 1) }

// ident tells ranks apart: rank r's element i is r*10+i (exact in every type).
func ident(r, i int) float64 { return float64(r*10 + i) }

// reduce is the independent computation of op over n ranks' values.
func reduce(op pybridge.Op, n int, v func(r int) float64) float64 {
	acc := v(0)
	for r := 1; r < n; r++ {
		x := v(r)
		switch op {
		case pybridge.Sum, pybridge.Avg:
			acc += x
		case pybridge.Min:
			acc = min(acc, x)
		case pybridge.Max:
			acc = max(acc, x)
		case pybridge.Product:
			acc *= x
		}
	}
	if op == pybridge.Avg {
		acc /= float64(n)
	}
	return acc
}

func fill[T pybridge.Numeric](n int, conv func(float64) T, f func(i int) float64) []T {
	s := make([]T, n)
	for i := range s {
		s[i] = conv(f(i))
	}
	return s
}

func same[T pybridge.Numeric](what string, got, want []T) error {
	if !slices.Equal(got, want) {
		return fmt.Errorf("%s: got %v, want %v", what, got, want)
	}
	return nil
}

// checkAll runs every collective on []T and compares with values computed here.
func checkAll[T pybridge.Numeric](g *pybridge.Group, name string, conv func(float64) T, float bool) error {
	const k = 5 // elements per rank
	n, me := g.Size(), g.Rank()
	ops := []pybridge.Op{pybridge.Sum, pybridge.Min, pybridge.Max, pybridge.Product}
	if float {
		ops = append(ops, pybridge.Avg)
	}
	for _, op := range ops {
		data := fill(k, conv, func(i int) float64 { return value(me, i) })
		if err := pybridge.AllReduce(g, data, op); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		want := fill(k, conv, func(i int) float64 {
			return reduce(op, n, func(r int) float64 { return value(r, i) })
		})
		if err := same(fmt.Sprintf("%s AllReduce %v", name, op), data, want); err != nil {
			return err
		}

		send := fill(n*k, conv, func(j int) float64 { return value(me, j) })
		recv := make([]T, k)
		if err := pybridge.ReduceScatter(g, send, recv, op); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		want = fill(k, conv, func(i int) float64 {
			return reduce(op, n, func(r int) float64 { return value(r, me*k+i) })
		})
		if err := same(fmt.Sprintf("%s ReduceScatter %v", name, op), recv, want); err != nil {
			return err
		}
	}

	for _, root := range []int{0, n - 1} {
		data := fill(k, conv, func(i int) float64 { return ident(me, i) })
		if err := pybridge.Broadcast(g, data, root); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		want := fill(k, conv, func(i int) float64 { return ident(root, i) })
		if err := same(fmt.Sprintf("%s Broadcast root %d", name, root), data, want); err != nil {
			return err
		}
	}

	send := fill(k, conv, func(i int) float64 { return ident(me, i) })
	recv := make([]T, n*k)
	if err := pybridge.AllGather(g, send, recv); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	want := fill(n*k, conv, func(j int) float64 { return ident(j/k, j%k) })
	if err := same(name+" AllGather", recv, want); err != nil {
		return err
	}

	if n > 1 {
		// A ring: even ranks send first, odd ranks receive first, so no rank
		// waits on a peer that is itself waiting.
		next, prev := (me+1)%n, (me+n-1)%n
		out := fill(k, conv, func(i int) float64 { return ident(me, i) })
		in := make([]T, k)
		steps := []func() error{
			func() error { return pybridge.Send(g, out, next, 7) },
			func() error { return pybridge.Recv(g, in, prev, 7) },
		}
		if me%2 == 1 {
			steps[0], steps[1] = steps[1], steps[0]
		}
		for _, step := range steps {
			if err := step(); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		want := fill(k, conv, func(i int) float64 { return ident(prev, i) })
		if err := same(fmt.Sprintf("%s Recv from %d", name, prev), in, want); err != nil {
			return err
		}
	}

	// Empty and nil slices are valid (count 0, NULL data).
	for _, empty := range [][]T{nil, {}} {
		if err := pybridge.AllReduce(g, empty, pybridge.Sum); err != nil {
			return fmt.Errorf("%s empty AllReduce: %w", name, err)
		}
		if err := pybridge.Broadcast(g, empty, 0); err != nil {
			return fmt.Errorf("%s empty Broadcast: %w", name, err)
		}
	}
	logf("%s: AllReduce, ReduceScatter (%d ops), Broadcast, AllGather, Send/Recv match", name, len(ops))
	return nil
}

// checkInPlace shows the data is not copied: a collective on a sub-slice
// writes exactly that window of the backing array, and a large slice works.
func checkInPlace(g *pybridge.Group) error {
	n, me := g.Size(), g.Rank()
	backing := []float32{-1, -1, float32(me + 1), float32(me + 2), -1}
	if err := pybridge.AllReduce(g, backing[2:4], pybridge.Sum); err != nil {
		return err
	}
	s := float32(n * (n + 1) / 2)
	if err := same("AllReduce on a sub-slice", backing, []float32{-1, -1, s, s + float32(n), -1}); err != nil {
		return err
	}
	big := make([]float64, 1<<20)
	for i := range big {
		big[i] = float64(i%1000) * float64(me+1)
	}
	if err := pybridge.AllReduce(g, big, pybridge.Sum); err != nil {
		return err
	}
	for i, v := range big {
		if want := float64(i%1000) * float64(s); v != want {
			return fmt.Errorf("large AllReduce: element %d is %v, want %v", i, v, want)
		}
	}
	logf("sub-slice and 1M-element AllReduce match")
	return nil
}
