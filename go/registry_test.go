package pybridge_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	pybridge "github.com/pybridge/pybridge/go"
)

// A user's Python module (tests/data/plugins/pb_user_registry.py) registers a comm hook
// and a server strategy; a Go program imports it into the library and chooses both by
// name on 2 ranks. tests/test_registries.py does the same from Python and C.

func init() { roles["registry"] = roleRegistry }

func TestRegisteredHookAndStrategyByName2Ranks(t *testing.T) {
	plugins, err := filepath.Abs(filepath.Join("..", "tests", "data", "plugins"))
	if err != nil {
		t.Fatal(err)
	}
	expectPass(t, runRanks(t, &launch{role: "registry", world: 2, limit: 120 * time.Second,
		env: []string{"PYBRIDGE_PYTHONPATH=" + plugins}}))
}

// wantInvalid checks that err is ErrInvalidArgument with a message holding text.
func wantInvalid(what string, err error, text string) error {
	if !errors.Is(err, pybridge.ErrInvalidArgument) || !strings.Contains(fmt.Sprint(err), text) {
		return fmt.Errorf("%s: want ErrInvalidArgument with %q, got %v", what, text, err)
	}
	return nil
}

func roleRegistry() error {
	if err := wantInvalid("a missing module", pybridge.ImportModule("no_such_plugin"),
		"no module named 'no_such_plugin'"); err != nil {
		return err
	}
	if err := pybridge.ImportModule("pb_user_registry"); err != nil {
		return err
	}
	g, err := pybridge.Init(pybridge.WithBackend("gloo"), pybridge.WithTimeout(60*time.Second))
	if err != nil {
		return err
	}
	defer g.Close()
	rank := float32(g.Rank())

	// The registered hook by name: each gradient becomes its largest value over the ranks.
	_, err = pybridge.NewReducer(g, pybridge.Params[float32](3), pybridge.WithHookName("no_such_hook"))
	if err := wantInvalid("an unknown hook", err, "unknown comm hook 'no_such_hook'; choose one of allreduce, "+
		"fp16, bf16, powersgd, hierarchical, elementwise_max"); err != nil {
		return err
	}
	red, err := pybridge.NewReducer(g, pybridge.Params[float32](3), pybridge.WithHook(pybridge.HookFP16),
		pybridge.WithHookName("elementwise_max"))
	if err != nil {
		return err
	}
	defer red.Close()
	for step := range 2 {
		grad, err := red.Grad(0)
		if err != nil {
			return err
		}
		copy(grad, []float32{rank, -rank, float32(step) * (rank + 1)})
		if err := red.MarkReady(0); err != nil {
			return err
		}
		if err := red.Wait(30 * time.Second); err != nil {
			return err
		}
		grad, _ = red.Grad(0)
		if want := []float32{1, 0, 2 * float32(step)}; !slices.Equal(grad, want) { // -0 == 0
			return fmt.Errorf("step %d: gradient %v, want the ranks' maximum %v", step, grad, want)
		}
	}

	// The registered strategy by name: x <- x - lr sign(pseudo-gradient). The first server
	// names an unknown strategy and is closed, which ends its federation for the worker.
	model := []float32{0, 0, 0}
	if g.Rank() == 0 {
		_, err := pybridge.NewFedServer[float32](g, pybridge.WithServerOptimizerName("no_such_strategy", 0))
		if err := wantInvalid("an unknown strategy", err, "unknown server strategy 'no_such_strategy'; choose one "+
			"of fedavg, fedadagrad, fedadam, fedyogi, signsgd"); err != nil {
			return err
		}
		s, err := pybridge.NewFedServer[float32](g, pybridge.WithServerOptimizerName("signsgd", 0))
		if err != nil {
			return err
		}
		defer s.Close()
		if err := s.StartRound([]int{0, 1}, model); err != nil {
			return err
		}
		for {
			_, ok, err := s.Next()
			if err != nil {
				return err
			}
			if !ok {
				break
			}
		}
		if n, err := s.Aggregate(0.25, model); err != nil || n != 2 {
			return fmt.Errorf("Aggregate: %d clients, %v", n, err)
		}
		if want := []float32{0.25, -0.25, 0}; !slices.Equal(model, want) {
			return fmt.Errorf("model %v, want signSGD's step %v", model, want)
		}
		step, ok, _, err := s.LastStep()
		if err != nil || !ok || step.LR != 0.25 {
			return fmt.Errorf("LastStep: %+v ok %v err %v", step, ok, err)
		}
		return nil
	}
	for range 2 { // the refused server's federation, then the real one
		w, err := pybridge.NewFedWorker[float32](g)
		if err != nil {
			return err
		}
		for {
			task, ok, err := w.Next()
			if err != nil {
				return err
			}
			if !ok {
				break
			}
			c := float32(task.Client + 1) // trained weights: model + (c+1) (1, -1, 0)
			task.Model[0], task.Model[1] = task.Model[0]+c, task.Model[1]-c
			if err := w.Submit(task.Model, task.Client+1); err != nil {
				return err
			}
		}
		if err := w.Close(); err != nil {
			return err
		}
	}
	logf("registry: hook and strategy by name, %s", os.Getenv("PYBRIDGE_PYTHONPATH"))
	return nil
}
