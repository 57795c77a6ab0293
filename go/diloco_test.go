package pybridge_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	pybridge "github.com/pybridge/pybridge/go"
)

func init() {
	roles["diloco"] = roleDiLoCo
	world2.share("diloco", "TestDiLoCo2Ranks")
}

// The runs of tests/diloco_parity.py from Go (plain DiLoCo; Streaming DiLoCo with 2
// fragments, tau 1, alpha 0.5; int4 with error feedback and its own outer SGD) end with
// the Python DiLoCo's weights kept in tests/data/diloco_parity.json (within 1e-6, syncs at
// the same steps), on 2 ranks (the shared world) and 3; bad options and calls are
// ErrInvalidArgument naming them in Go's words.
func TestDiLoCo2Ranks(t *testing.T) { expectRolePass(t, world2, "diloco") }

func TestDiLoCo3Ranks(t *testing.T) {
	expectPass(t, runRanks(t, &launch{role: "diloco", world: 3, limit: 120 * time.Second, stopOnFailure: true}))
}

// dilocoParity is tests/data/diloco_parity.json.
type dilocoParity struct {
	Sizes   []int
	Steps   int
	Configs map[string]map[string]any
	Results map[string][]map[string]struct {
		Weights []float64
		Synced  []int
	}
}

// dilocoStart and dilocoInnerStep are tests/diloco_parity.py's initial() and inner_step()
// in float32 (the conversion rounds the product, so no fused multiply-add changes it).
func dilocoStart(sizes []int) [][]float32 {
	params := make([][]float32, len(sizes))
	for i, n := range sizes {
		params[i] = make([]float32, n)
		for j := range params[i] {
			params[i][j] = float32((i*13+j*7)%17-8) * 0.05
		}
	}
	return params
}

func dilocoInnerStep(params [][]float32, rank, step int) {
	for i, p := range params {
		for j := range p {
			target := float32((rank*7+step*3+i*5+j)%11-5) * 0.1
			p[j] -= float32(0.25 * (p[j] - target))
		}
	}
}

// dilocoOptions turns a configuration of the file into syncEvery and options; a field
// this test does not know fails it (a new configuration needs its Go spelling here).
func dilocoOptions(config map[string]any) (int, []pybridge.DiLoCoOption, error) {
	num := func(k string) float64 { v, _ := config[k].(float64); return v }
	syncEvery := int(num("sync_every"))
	var opts []pybridge.DiLoCoOption
	quant := map[string]pybridge.Quantization{"fp32": pybridge.QuantFP32, "bf16": pybridge.QuantBF16,
		"fp8": pybridge.QuantFP8, "int8": pybridge.QuantInt8, "int4": pybridge.QuantInt4}
	for k, v := range config {
		switch k {
		case "sync_every", "outer_momentum", "outer_nesterov":
		case "fragments":
			opts = append(opts, pybridge.WithFragments(int(num(k))))
		case "delay":
			opts = append(opts, pybridge.WithDelay(int(num(k))))
		case "alpha":
			opts = append(opts, pybridge.WithAlpha(num(k)))
		case "block_size":
			opts = append(opts, pybridge.WithBlockSize(int(num(k))))
		case "quantization":
			opts = append(opts, pybridge.WithQuantization(quant[v.(string)]))
		case "error_feedback":
			if v.(bool) {
				opts = append(opts, pybridge.WithErrorFeedback())
			}
		case "outer_lr":
			opts = append(opts, pybridge.WithOuterSGD(num(k), num("outer_momentum"), config["outer_nesterov"].(bool)))
		default:
			return 0, nil, fmt.Errorf("configuration field %q has no Go option in this test", k)
		}
	}
	return syncEvery, opts, nil
}

func roleDiLoCo() error {
	raw, err := os.ReadFile(filepath.Join("..", "tests", "data", "diloco_parity.json"))
	if err != nil {
		return err
	}
	var file dilocoParity
	if err := json.Unmarshal(raw, &file); err != nil {
		return err
	}
	g, err := initRole(pybridge.WithBackend("gloo"), pybridge.WithTimeout(60*time.Second))
	if err != nil {
		return err
	}
	defer g.Close()
	rank, world := g.Rank(), g.Size()
	want := file.Results[fmt.Sprint(world)]
	if len(want) != world || len(file.Configs) == 0 {
		return fmt.Errorf("tests/data/diloco_parity.json has no runs of %d ranks", world)
	}
	// In one order on every rank: creating a DiLoCo is a collective.
	var names []string
	for name := range file.Configs {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		syncEvery, opts, err := dilocoOptions(file.Configs[name])
		if err != nil {
			return err
		}
		params := dilocoStart(file.Sizes)
		d, err := pybridge.NewDiLoCo(g, params, syncEvery, opts...)
		if err != nil {
			return fmt.Errorf("%s: %v", name, err)
		}
		var synced []int
		for t := 1; t <= file.Steps; t++ {
			dilocoInnerStep(params, rank, t)
			did, err := d.Step(params)
			if err != nil {
				return fmt.Errorf("%s step %d: %v", name, t, err)
			}
			if did {
				synced = append(synced, t)
			}
		}
		counts, err := d.Counts()
		if err != nil || counts.Steps != int64(file.Steps) || counts.Syncs != int64(len(synced)) || counts.BytesSent <= 0 {
			return fmt.Errorf("%s: Counts %+v, %v", name, counts, err)
		}
		if err := d.Close(); err != nil {
			return err
		}
		w := want[rank][name]
		if !slices.Equal(synced, w.Synced) {
			return fmt.Errorf("%s: synced at %v, Python at %v", name, synced, w.Synced)
		}
		at, worst := 0, 0.0
		for _, p := range params {
			for _, v := range p {
				worst = math.Max(worst, math.Abs(float64(v)-w.Weights[at]))
				at++
			}
		}
		if at != len(w.Weights) || worst > 1e-6 {
			return fmt.Errorf("%s: %d weights, largest difference from Python's %g", name, at, worst)
		}
		logf("%s: synced at %v, largest difference from Python's %g", name, synced, worst)
	}
	return dilocoMisuse(g, file.Sizes)
}

// dilocoMisuse: bad options and calls, the same on every rank, and a setting that differs
// across ranks (every rank is told).
func dilocoMisuse(g *pybridge.Group, sizes []int) error {
	invalid := pybridge.ErrInvalidArgument
	params := dilocoStart(sizes)
	for _, c := range []struct {
		what      string
		syncEvery int
		opts      []pybridge.DiLoCoOption
		words     string
	}{
		{"syncEvery 0", 0, nil, "sync_every must be a positive integer, got 0"},
		{"5 fragments of 4", 10, []pybridge.DiLoCoOption{pybridge.WithFragments(5)}, "5 fragments of 4 tensors"},
		{"fragments 2^40", 4, []pybridge.DiLoCoOption{pybridge.WithFragments(1 << 40)}, "WithFragments: fragments"},
		{"delay too long", 4, []pybridge.DiLoCoOption{pybridge.WithFragments(2), pybridge.WithDelay(2)},
			"delay 2 must be below sync_every / fragments = 2"},
		{"alpha 1.5", 4, []pybridge.DiLoCoOption{pybridge.WithAlpha(1.5)}, "alpha must be a number in [0, 1], got 1.5"},
		{"alpha NaN", 4, []pybridge.DiLoCoOption{pybridge.WithAlpha(math.NaN())}, "alpha must be a number in [0, 1]"},
		{"outer lr 0", 4, []pybridge.DiLoCoOption{pybridge.WithOuterSGD(0, 0.9, true)}, "outer_lr must be a positive"},
		{"Nesterov without momentum", 4, []pybridge.DiLoCoOption{pybridge.WithOuterSGD(0.7, 0, true)},
			"outer_nesterov needs outer_momentum > 0"},
		{"quantization 9", 4, []pybridge.DiLoCoOption{pybridge.WithQuantization(9)},
			"DiLoCoOption.quantization must be QuantFP32 (0), QuantBF16 (1), QuantFP8 (2), QuantInt8 (3) or QuantInt4 (4), got 9"},
		{"block size 0", 4, []pybridge.DiLoCoOption{pybridge.WithQuantization(pybridge.QuantInt8), pybridge.WithBlockSize(0)},
			"block size must be an integer in [1, 16777216], got 0"},
		{"error feedback on fp32", 4, []pybridge.DiLoCoOption{pybridge.WithErrorFeedback()},
			"error_feedback needs a lossy quantization"},
		{"alpha differs", 4, []pybridge.DiLoCoOption{pybridge.WithAlpha(0.25 * float64(g.Rank()))},
			"DiLoCo settings differ across ranks"},
	} {
		d, err := pybridge.NewDiLoCo(g, params, c.syncEvery, c.opts...)
		if d != nil {
			d.Close()
		}
		if err := inGo(c.what, err, invalid, c.words); err != nil {
			return err
		}
	}
	_, err := pybridge.NewDiLoCo[float32](g, nil, 4)
	if err := inGo("no params", err, invalid, "params is empty"); err != nil {
		return err
	}
	var none *pybridge.DiLoCo[float32]
	_, err = none.Step(params)
	if err := inGo("nil DiLoCo", err, invalid, "nil *DiLoCo"); err != nil {
		return err
	}
	d, err := pybridge.NewDiLoCo(g, params, 4)
	if err != nil {
		return err
	}
	_, err = d.Step(params[:3])
	if err := inGo("3 slices", err, invalid, "params: 3 tensors"); err != nil {
		return err
	}
	if did, err := d.Step(params); err != nil || did {
		return fmt.Errorf("a first step: %v, %v", did, err)
	}
	if err := d.Close(); err != nil {
		return err
	}
	if err := d.Close(); err != nil {
		return fmt.Errorf("a second Close: %v", err)
	}
	if _, err := d.Step(params); !errors.Is(err, pybridge.ErrClosed) {
		return fmt.Errorf("Step after Close: %v, want ErrClosed", err)
	}
	return nil
}
