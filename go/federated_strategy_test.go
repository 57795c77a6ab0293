package pybridge_test

import (
	"errors"
	"fmt"
	"math"
	"os"
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

func TestFedProxGrad(t *testing.T) {
	grad := []float32{1, 1, 1}
	if err := pybridge.FedProxGrad(grad, []float32{2, 0, 5}, []float32{1, 1, 1}, 0.5); err != nil {
		t.Fatal(err)
	}
	if grad[0] != 1.5 || grad[1] != 0.5 || grad[2] != 3 {
		t.Errorf("grad %v, want [1.5 0.5 3]", grad)
	}
	if err := pybridge.FedProxGrad(grad, []float32{1}, []float32{1, 1, 1}, 0.5); !errors.Is(err, pybridge.ErrInvalidArgument) {
		t.Errorf("lengths differ: %v", err)
	}
	if err := pybridge.FedProxGrad(grad, grad, grad, math.NaN()); !errors.Is(err, pybridge.ErrInvalidArgument) {
		t.Errorf("mu NaN: %v", err)
	}
}
