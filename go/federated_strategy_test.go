package pybridge_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	pybridge "github.com/pybridge/pybridge/go"
)

// A Go server in FedBuff mode with FedAdam over Go workers (ranks 1, 2) and a
// Python worker (rank 3): its model is checked against FedAdam over the
// staleness-weighted steps, computed here in float64 from the results' order.

func init() {
	roles["fedbuffserver"] = func() error {
		if os.Getenv("RANK") != "0" {
			return roleFedWorker()
		}
		return roleFedBuffServer()
	}
}

func roleFedBuffServer() error {
	g, err := fedInit()
	if err != nil {
		return err
	}
	defer g.Close()
	s, err := pybridge.NewFedServer[float32](g, pybridge.WithFedMode(pybridge.FedBuff), pybridge.WithBufferSize(2),
		pybridge.WithServerOptimizer(pybridge.FedAdam, 0.1), pybridge.WithStaleness(pybridge.StalenessPolynomial, 0.5, -1),
		pybridge.WithClientTimeout(time.Minute))
	if err != nil {
		return err
	}
	defer s.Close()
	if _, ok, _, err := s.LastStep(); ok || err != nil {
		return fmt.Errorf("LastStep before any step: ok %v, err %v", ok, err)
	}
	model := make([]float32, len(fedV))
	clients := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
	if err := s.StartRound(clients, model); err != nil {
		return err
	}
	type pulled struct{ client, round int }
	var got []pulled
	for {
		r, ok, err := s.Next()
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		got = append(got, pulled{r.Client, r.Round})
	}
	n, err := s.Aggregate(0, model)
	if err != nil {
		return err
	}
	steps := len(got) / 2
	if n != 2*steps {
		return fmt.Errorf("Aggregate: %d clients, want %d (%d pulled)", n, 2*steps, len(got))
	}
	// FedAdam (beta1 0.9, beta2 0.99, tau 1e-3, v from tau^2) over FedBuff's steps.
	x, m, v := make([]float64, 5), make([]float64, 5), []float64{1e-6, 1e-6, 1e-6, 1e-6, 1e-6}
	for k := 0; k < steps; k++ {
		var num [5]float64
		den := 0.0
		for _, p := range got[2*k : 2*k+2] {
			tau, samples := float64(1+k-p.round), float64(p.client+1)
			for i := range num {
				num[i] += math.Pow(1+tau, -0.5) * samples * -samples * float64(fedV[i])
			}
			den += samples
		}
		for i := range x {
			d := -num[i] / den
			m[i] = 0.9*m[i] + 0.1*d
			v[i] = 0.99*v[i] + 0.01*d*d
			x[i] = float64(float32(x[i] + 0.1*m[i]/(math.Sqrt(v[i])+1e-3)))
		}
	}
	for i := range x {
		if math.Abs(float64(model[i])-x[i]) > 1e-5*math.Abs(x[i]) {
			return fmt.Errorf("model %v, want %v (results %v)", model, x, got)
		}
	}
	step, ok, refused, err := s.LastStep()
	if err != nil || !ok || step.Version != 1+steps || step.Clients != 2 || step.LR != 0.1 || refused != 0 {
		return fmt.Errorf("LastStep: %+v ok %v refused %d err %v", step, ok, refused, err)
	}
	logf("fedbuff: %d results, %d steps, model %v", len(got), steps, model)
	return nil
}

func TestFederatedGoFedBuffServerWithFedAdam(t *testing.T) {
	fedLaunch(t, "fedbuffserver", map[int]string{3: "worker"})
}

// fedProxCase is one case of tests/data/fedprox.json, which the Python test of
// add_proximal_grad runs too (tests/test_federated_strategies.py).
type fedProxCase struct {
	Name    string    `json:"name"`
	Mu      string    `json:"mu"` // JSON has no Inf or NaN: parsed by strconv.ParseFloat
	Grad    []float64 `json:"grad"`
	Weights []float64 `json:"weights"`
	Global  []float64 `json:"global"`
	Want    []float64 `json:"want"`
	Error   string    `json:"error"`
}

func TestFedProxGradFollowsTheSharedTable(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "tests", "data", "fedprox.json"))
	if err != nil {
		t.Fatal(err)
	}
	var table struct{ Cases []fedProxCase }
	if err := json.Unmarshal(raw, &table); err != nil {
		t.Fatal(err)
	}
	if len(table.Cases) == 0 {
		t.Fatal("tests/data/fedprox.json has no cases")
	}
	for _, c := range table.Cases {
		mu, err := strconv.ParseFloat(c.Mu, 64)
		if err != nil {
			t.Fatalf("%s: mu %q: %v", c.Name, c.Mu, err)
		}
		t.Run(c.Name+"/float32", func(t *testing.T) { checkFedProx(t, c, mu, float32(0)) })
		t.Run(c.Name+"/float64", func(t *testing.T) { checkFedProx(t, c, mu, float64(0)) })
	}
}

func checkFedProx[T float32 | float64](t *testing.T, c fedProxCase, mu float64, _ T) {
	conv := func(xs []float64) []T {
		out := make([]T, len(xs))
		for i, x := range xs {
			out[i] = T(x)
		}
		return out
	}
	grad := conv(c.Grad)
	err := pybridge.FedProxGrad(grad, conv(c.Weights), conv(c.Global), mu)
	want := c.Want
	if c.Error != "" {
		if !errors.Is(err, pybridge.ErrInvalidArgument) || !strings.Contains(err.Error(), c.Error) {
			t.Fatalf("want ErrInvalidArgument saying %q, got %v", c.Error, err)
		}
		want = c.Grad // left as it was
	} else if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(grad, conv(want)) {
		t.Errorf("grad %v, want %v", grad, want)
	}
}

// Go's own case: grad is a slice of its own (Python's is the parameter's .grad).
func TestFedProxGradRefusesAGradOfAnotherLength(t *testing.T) {
	grad := []float32{1, 1}
	err := pybridge.FedProxGrad(grad, []float32{1, 1, 1}, []float32{1, 1, 1}, 0.5)
	if !errors.Is(err, pybridge.ErrInvalidArgument) || !strings.Contains(err.Error(), "FedProx's grad must match the weights") {
		t.Fatalf("grad of 2 for 3 weights: %v", err)
	}
	if grad[0] != 1 || grad[1] != 1 {
		t.Errorf("grad changed: %v", grad)
	}
}
