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

	pybridge "github.com/pybridge/pybridge/go"
)

// Federated training on 4 gloo ranks (a server and 3 workers) with Go and Python
// peers mixed: Go workers under a Python server, and a Go server over Go and Python
// workers. The Python ranks run tests/federated_peer.py; the known results are
// the same: client c trains to model + (c+1) V from c+1 samples, so each round at
// lr 1 moves the model by exactly 325 * (1, 2, 3, 4, 5) (FedAvg's weighted mean).

func init() {
	roles["fedworker"] = roleFedWorker
	roles["fedserver"] = func() error { // rank 0 serves, the other Go ranks are workers
		if os.Getenv("RANK") != "0" {
			return roleFedWorker()
		}
		return roleFedServer()
	}
}

var fedV = []float32{39, 78, 117, 156, 195}

const (
	fedFailing   = 100 // a client whose training fails on every worker
	fedPoisoned  = 101 // a client whose training gives NaN weights on every worker
	fedStraggler = 102 // held by its worker until the server writes the file "go"
)

// fedMetrics are client c's metrics, as every worker (Go or Python) sends them.
func fedMetrics(c int) map[string]float64 {
	return map[string]float64{"loss": float64(c) / 8, "acc": 1 / float64(c+1)}
}

func fedStep(rounds float32) []float32 {
	out := make([]float32, len(fedV))
	for i := range out {
		out[i] = rounds * 325 * float32(i+1)
	}
	return out
}

func fedInit() (*pybridge.Group, error) {
	return pybridge.Init(pybridge.WithBackend("gloo"), pybridge.WithTimeout(60*time.Second))
}

// roleFedWorker is a Go worker: the loop a Go program drives, plus misuse.
func roleFedWorker() error {
	g, err := fedInit()
	if err != nil {
		return err
	}
	defer g.Close()
	if _, err := pybridge.NewFedServer[float32](g); !errors.Is(err, pybridge.ErrInvalidArgument) {
		return fmt.Errorf("a server on rank %d: want ErrInvalidArgument, got %v", g.Rank(), err)
	}
	w, err := pybridge.NewFedWorker[float32](g)
	if err != nil {
		return err
	}
	if err := w.Submit(fedV, 1); !errors.Is(err, pybridge.ErrInvalidArgument) {
		return fmt.Errorf("Submit without a task: want ErrInvalidArgument, got %v", err)
	}
	tasks, checked := 0, false
	for {
		task, ok, err := w.Next()
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		tasks++
		switch {
		case task.Client == fedFailing:
			err = w.Fail(fmt.Sprintf("client %d has no data", task.Client))
		case task.Command == pybridge.FedEvaluate:
			err = w.Submit([]float32{2 * float32(task.Client), float32(g.Rank())}, 3)
		case task.Client == fedPoisoned:
			for i := range task.Model {
				task.Model[i] = float32(math.NaN())
			}
			err = w.Submit(task.Model, 1)
		default:
			if !checked { // weights of the wrong length are refused and the task stays open
				checked = true
				if err := w.Submit(task.Model[:4], 1); !errors.Is(err, pybridge.ErrInvalidArgument) {
					return fmt.Errorf("short weights: want ErrInvalidArgument, got %v", err)
				}
			}
			if task.Client == fedStraggler {
				if err := fedWaitFile("go"); err != nil {
					return err
				}
			}
			for i := range task.Model {
				task.Model[i] += float32(task.Client+1) * fedV[i]
			}
			err = w.SubmitMetrics(task.Model, task.Client+1, fedMetrics(task.Client))
		}
		if err != nil {
			return err
		}
	}
	logf("tasks %d", tasks)
	if err := w.Close(); err != nil {
		return err
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("second Close: %v", err)
	}
	if _, _, err := w.Next(); !errors.Is(err, pybridge.ErrClosed) {
		return fmt.Errorf("Next after Close: want ErrClosed, got %v", err)
	}
	return nil
}

// roleFedServer is a Go server: two training rounds checked against FedAvg's exact
// value, an evaluation round, a failing client, misuse.
func roleFedServer() error {
	g, err := fedInit()
	if err != nil {
		return err
	}
	defer g.Close()
	if _, err := pybridge.NewFedWorker[float32](g); !errors.Is(err, pybridge.ErrInvalidArgument) {
		return fmt.Errorf("a worker on rank 0: want ErrInvalidArgument, got %v", err)
	}
	// Client c trains from c + 1 samples; the straggler (client 102) claims the most,
	// 103. A bound passed wrong (any value under 12) would retire workers in the first
	// rounds and fail them. (12 here retired the straggler's worker whenever its late
	// result came in before Close: a flaky failure under load.)
	s, err := pybridge.NewFedServer[float32](g, pybridge.WithClientTimeout(60*time.Second),
		pybridge.WithMaxSamples(fedStraggler+1))
	if err != nil {
		return err
	}
	if _, _, err := s.Next(); !errors.Is(err, pybridge.ErrInvalidArgument) {
		return fmt.Errorf("Next before a round: want ErrInvalidArgument, got %v", err)
	}
	if err := s.StartRound([]int{1, 1}, make([]float32, 5)); !errors.Is(err, pybridge.ErrInvalidArgument) {
		return fmt.Errorf("a client twice: want ErrInvalidArgument, got %v", err)
	}
	clients := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}
	model := make([]float32, 5)
	for round := 1; round <= 2; round++ {
		if err := s.StartRound(clients, model); err != nil {
			return err
		}
		var got []int
		workers := map[int]bool{}
		for {
			r, ok, err := s.Next()
			if err != nil {
				return err
			}
			if !ok {
				break
			}
			if r.Command != pybridge.FedTrain || r.Round != round || r.Samples != r.Client+1 || r.Len != 5 {
				return fmt.Errorf("round %d: unexpected result %+v", round, r)
			}
			grad := make([]float32, r.Len)
			if err := s.Payload(grad); err != nil {
				return err
			}
			for i := range grad {
				if grad[i] != -float32(r.Client+1)*fedV[i] {
					return fmt.Errorf("client %d's pseudo-gradient is %v", r.Client, grad)
				}
			}
			for name, want := range fedMetrics(r.Client) {
				if v, ok, err := s.ResultMetric(name); err != nil || !ok || v != want {
					return fmt.Errorf("client %d's metric %s: %v %v %v, want %v", r.Client, name, v, ok, err, want)
				}
			}
			if _, ok, err := s.ResultMetric("none"); ok || err != nil {
				return fmt.Errorf("a metric nobody sent: ok %v, err %v", ok, err)
			}
			got = append(got, r.Client)
			workers[r.Worker] = true
		}
		var sum, weights float64
		for _, c := range clients {
			sum += float64(c+1) * fedMetrics(c)["acc"]
			weights += float64(c + 1)
		}
		if v, ok, err := s.RoundMetric("acc"); err != nil || !ok || math.Abs(v-sum/weights) > 1e-12 {
			return fmt.Errorf("round %d's mean acc: %v %v %v, want %v", round, v, ok, err, sum/weights)
		}
		slices.Sort(got)
		if !slices.Equal(got, clients) || len(workers) != 3 {
			return fmt.Errorf("round %d: clients %v from workers %v", round, got, workers)
		}
		n, err := s.Aggregate(1.0, model)
		if err != nil || n != 12 {
			return fmt.Errorf("Aggregate: %d clients, %v", n, err)
		}
		if want := fedStep(float32(round)); !slices.Equal(model, want) {
			return fmt.Errorf("round %d: model %v, want %v", round, model, want)
		}
	}
	if _, err := s.Aggregate(1.0, model); !errors.Is(err, pybridge.ErrInvalidArgument) {
		return fmt.Errorf("a second Aggregate: want ErrInvalidArgument, got %v", err)
	}

	if err := s.StartEvaluation([]int{0, 1, 2, 3, 4, 5}, model); err != nil {
		return err
	}
	evaluated := 0
	for {
		r, ok, err := s.Next()
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		m := make([]float32, r.Len)
		if err := s.Payload(m); err != nil {
			return err
		}
		if r.Command != pybridge.FedEvaluate || r.Samples != 3 ||
			!slices.Equal(m, []float32{2 * float32(r.Client), float32(r.Worker)}) {
			return fmt.Errorf("evaluation result %+v with metrics %v", r, m)
		}
		evaluated++
	}
	if evaluated != 6 {
		return fmt.Errorf("%d evaluation results, want 6", evaluated)
	}

	if err := s.StartRound([]int{fedFailing}, model); err != nil {
		return err
	}
	_, _, err = s.Next()
	var fe *pybridge.FedWorkerError
	if !errors.As(err, &fe) || !errors.Is(err, pybridge.ErrComm) || fe.Client != fedFailing ||
		fe.Worker < 1 || fe.Worker > 3 || !strings.Contains(err.Error(), "has no data") {
		return fmt.Errorf("a failing client: want a FedWorkerError (ErrComm) naming client %d, got %#v", fedFailing, err)
	}
	logf("failure: %v", err)
	if _, ok, err := s.Next(); ok || err != nil {
		return fmt.Errorf("after the failure: ok %v, err %v; want the round over", ok, err)
	}
	if err := fedIntegrity(s, model); err != nil {
		return err
	}
	if err := s.Close(); err != nil {
		return err
	}
	if err := s.Close(); err != nil {
		return fmt.Errorf("second Close: %v", err)
	}
	if _, _, err := s.Next(); !errors.Is(err, pybridge.ErrClosed) {
		return fmt.Errorf("Next after Close: want ErrClosed, got %v", err)
	}
	return nil
}

// fedIntegrity: an empty round and a NaN update are refused by name; a round left
// before its straggler is back does not hold up the next, whose FedAvg is exact.
func fedIntegrity(s *pybridge.FedServer[float32], model []float32) error {
	if err := s.StartRound(nil, model); !errors.Is(err, pybridge.ErrInvalidArgument) {
		return fmt.Errorf("an empty round: want ErrInvalidArgument, got %v", err)
	}
	if err := s.StartRound([]int{fedPoisoned}, model); err != nil {
		return err
	}
	_, _, err := s.Next()
	var fe *pybridge.FedWorkerError
	if !errors.As(err, &fe) || !errors.Is(err, pybridge.ErrCorrupt) || fe.Client != fedPoisoned || fe.Round != 5 ||
		!strings.Contains(err.Error(), "NaN or Inf") || !strings.Contains(err.Error(), "round 5") {
		return fmt.Errorf("a NaN update: want a FedWorkerError (ErrCorrupt) naming client %d and round 5, got %#v",
			fedPoisoned, err)
	}
	logf("refused: %v", err)
	if err := s.StartRound([]int{fedStraggler, 0, 1, 2, 3, 4, 5}, model); err != nil {
		return err
	}
	for range 6 { // leave the round with its straggler still out
		if r, ok, err := s.Next(); err != nil || !ok || r.Client == fedStraggler {
			return fmt.Errorf("over-selection: %+v %v %v", r, ok, err)
		}
	}
	before := slices.Clone(model)
	start := time.Now()
	clients := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}
	if err := s.SetAffinity(3, []int{9}); !errors.Is(err, pybridge.ErrInvalidArgument) {
		return fmt.Errorf("affinity to rank 9: want ErrInvalidArgument, got %v", err)
	}
	for _, c := range []int{0, 1} { // their data lives on worker 3 only
		if err := s.SetAffinity(c, []int{3}); err != nil {
			return err
		}
	}
	if err := s.StartRound(clients, model); err != nil {
		return err
	}
	for {
		r, ok, err := s.Next()
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		if r.Round != 7 {
			return fmt.Errorf("a result of round %d in round 7", r.Round)
		}
		if r.Client <= 1 && r.Worker != 3 {
			return fmt.Errorf("client %d (affinity: worker 3) trained by worker %d", r.Client, r.Worker)
		}
	}
	if n, err := s.Aggregate(1.0, model); err != nil || n != len(clients) {
		return fmt.Errorf("Aggregate after over-selection: %d, %v", n, err)
	}
	elapsed := time.Since(start)
	if err := os.WriteFile(fedFile("go"), nil, 0o644); err != nil {
		return err
	}
	step := fedStep(1)
	for i := range model {
		if model[i]-before[i] != step[i] {
			return fmt.Errorf("after over-selection the model moved by %v - %v, want %v", model, before, step)
		}
	}
	if elapsed > 20*time.Second { // the straggler waits 60 s for "go"
		return fmt.Errorf("the round after over-selection took %v: it waited for the straggler", elapsed)
	}
	return nil
}

// fedLaunch runs the role's ranks with the Python ranks given in python (rank -> role
// of tests/federated_peer.py).
func fedLaunch(t *testing.T, role string, python map[int]string) []*rankProc {
	t.Helper()
	exe := os.Getenv("PYBRIDGE_PYTHON")
	if exe == "" {
		var err error
		if exe, err = exec.LookPath("python3"); err != nil {
			t.Skip("python3 not found")
		}
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	peer := filepath.Join(root, "tests", "federated_peer.py")
	procs := runRanks(t, &launch{
		role: role, world: 4, limit: 150 * time.Second,
		env: []string{"PYTHONPATH=" + root + string(os.PathListSeparator) + os.Getenv("PYTHONPATH"),
			"PB_TEST_DIR=" + t.TempDir()},
		argv: func(r int) []string {
			if p, ok := python[r]; ok {
				return []string{exe, peer, p}
			}
			return nil
		},
	})
	expectPass(t, procs)
	return procs
}

func TestFederatedGoWorkersUnderAPythonServer(t *testing.T) {
	procs := fedLaunch(t, "fedworker", map[int]string{0: "server", 3: "worker"})
	out := procs[0].out.String()
	i := strings.Index(out, "RESULT ")
	if i < 0 {
		t.Fatalf("the Python server printed no result\n%s", dump(procs))
	}
	var res struct {
		Model  []float32
		Seen   [][4]int
		Failed []any
	}
	if err := json.Unmarshal([]byte(strings.SplitN(out[i+len("RESULT "):], "\n", 2)[0]), &res); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Model, fedStep(2)) {
		t.Errorf("model %v, want %v", res.Model, fedStep(2))
	}
	for round := 1; round <= 2; round++ {
		var clients []int
		workers := map[int]bool{}
		for _, s := range res.Seen {
			if s[0] == round {
				clients = append(clients, s[1])
				workers[s[2]] = true
				if s[3] != s[1]+1 {
					t.Errorf("client %d: %d samples", s[1], s[3])
				}
			}
		}
		slices.Sort(clients)
		// every worker is idle at a round's start, so each gets a client: the Go ones too
		if len(clients) != 12 || clients[0] != 0 || clients[11] != 11 || len(workers) != 3 {
			t.Errorf("round %d: clients %v from workers %v", round, clients, workers)
		}
	}
	// Client 100 goes to the first idle worker, rank 1: a Go worker's Fail reaches Python.
	if len(res.Failed) != 3 || res.Failed[0] != 1.0 || res.Failed[1] != float64(fedFailing) ||
		!strings.Contains(fmt.Sprint(res.Failed[2]), "has no data") {
		t.Errorf("failure: %v", res.Failed)
	}
	for _, p := range procs[1:3] {
		if !strings.Contains(p.out.String(), "tasks ") {
			t.Errorf("rank %d (Go) reported no tasks", p.rank)
		}
	}
}

func TestFederatedGoServerWithGoAndPythonWorkers(t *testing.T) {
	fedLaunch(t, "fedserver", map[int]string{3: "worker"})
}

func TestFederatedNilValuesAreErrors(t *testing.T) {
	if _, err := pybridge.NewFedServer[float32](nil); !errors.Is(err, pybridge.ErrInvalidArgument) {
		t.Errorf("NewFedServer(nil): %v", err)
	}
	if _, err := pybridge.NewFedWorker[float64](nil); !errors.Is(err, pybridge.ErrInvalidArgument) {
		t.Errorf("NewFedWorker(nil): %v", err)
	}
	var s *pybridge.FedServer[float32]
	if _, _, err := s.Next(); !errors.Is(err, pybridge.ErrInvalidArgument) {
		t.Errorf("nil server Next: %v", err)
	}
	if err := s.Close(); !errors.Is(err, pybridge.ErrInvalidArgument) {
		t.Errorf("nil server Close: %v", err)
	}
	var w *pybridge.FedWorker[float32]
	if err := w.Submit([]float32{1}, 1); !errors.Is(err, pybridge.ErrInvalidArgument) {
		t.Errorf("nil worker Submit: %v", err)
	}
	if err := w.Fail("x"); !errors.Is(err, pybridge.ErrInvalidArgument) {
		t.Errorf("nil worker Fail: %v", err)
	}
}

func TestFedSampleClientsIsTheCoresDraw(t *testing.T) {
	got, err := pybridge.SampleClients(20, 4, 1, 1)
	if err != nil || !slices.Equal(got, []int{0, 3, 11, 13}) { // tests/test_federated_units.py pins it
		t.Fatalf("SampleClients(20, 4, 1, 1) = %v, %v", got, err)
	}
	if _, err := pybridge.SampleClients(3, 4, 1, 1); !errors.Is(err, pybridge.ErrInvalidArgument) {
		t.Errorf("4 of 3 clients: want ErrInvalidArgument, got %v", err)
	}
	if _, err := pybridge.SampleClients(3, 2, 1, -1); !errors.Is(err, pybridge.ErrInvalidArgument) {
		t.Errorf("round -1: want ErrInvalidArgument, got %v", err)
	}
}
