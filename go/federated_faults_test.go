package pybridge_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	pybridge "github.com/pybridge/pybridge/go"
)

// Federated faults with a Go server over three Go workers (4 gloo ranks): worker 2
// dies or stalls while it holds its second client. Without requeue FedServer.Next
// returns a *FedWorkerError naming the worker and the client (ErrComm for a death,
// ErrTimeout past the client timeout); with WithRequeue the rounds complete with
// every client answered once and FedAvg's exact value, and the lost worker gets no
// more clients. Close after a loss returns nil. When the server dies, a Go worker's
// Next returns ErrComm naming rank 0 instead of waiting. The ranks share a
// directory (PB_TEST_DIR): the faulty worker writes the round and client it holds
// there, and the server releases a stalled worker through it.

func init() { roles["fedfault"] = roleFedFault }

const fedFaulty = 2 // the worker rank that dies or stalls on its second client

var fedClients = []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}

func fedFile(name string) string { return filepath.Join(os.Getenv("PB_TEST_DIR"), name) }

// fedWaitFile waits, bounded, for another rank to create the file.
func fedWaitFile(name string) error {
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); {
		if _, err := os.Stat(fedFile(name)); err == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s did not appear within 60 s", name)
}

// fedHeld is the round and client the faulty worker held when it died or stalled.
func fedHeld(key string) (round, client int, err error) {
	data, err := os.ReadFile(fedFile("client-" + key))
	if err == nil {
		_, err = fmt.Sscan(string(data), &round, &client)
	}
	return round, client, err
}

func roleFedFault() error {
	g, err := fedInit()
	if err != nil {
		return err
	}
	fault := os.Getenv("PB_TEST_FAULT")
	if g.Rank() == 0 {
		if fault == "kill-requeue" { // the server dies after checking its rounds: no Close
			if err := fedRequeueServer(g); err != nil {
				return err
			}
			logf("rounds checked; the server dies")
			os.Exit(4)
		}
		defer g.Close()
		if fault == "kill" {
			return fedFaultServer(g, fault, false, 30*time.Second, 3, pybridge.ErrComm)
		}
		for _, requeue := range []bool{false, true} {
			if err := fedFaultServer(g, fedKey(fault, requeue), requeue, 3*time.Second, 2, pybridge.ErrTimeout); err != nil {
				return err
			}
		}
		return nil
	}
	switch fault {
	case "kill":
		defer g.Close()
		_, err := fedFaultWorker(g, fault)
		return err
	case "kill-requeue":
		_, err := fedFaultWorker(g, fault)
		logf("Next after the server died: %v", err)
		if !errors.Is(err, pybridge.ErrComm) || !strings.Contains(err.Error(), "rank 0") {
			return fmt.Errorf("Next after the server died: want ErrComm naming rank 0, got %v", err)
		}
		return nil // no Close: the group's store lived in the server's process
	}
	defer g.Close()
	for _, requeue := range []bool{false, true} {
		key := fedKey(fault, requeue)
		tasks, err := fedFaultWorker(g, key)
		if err != nil {
			return err
		}
		if g.Rank() == fedFaulty {
			// terminated after its late answer, given no client after the one it held
			if len(tasks) != 2 {
				return fmt.Errorf("%s: the stalled worker's tasks %v; want two", key, tasks)
			}
			if err := os.WriteFile(fedFile("done-"+key), nil, 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

func fedKey(fault string, requeue bool) string {
	if requeue {
		return fault + "-requeue"
	}
	return fault
}

// fedFaultWorker answers tasks with the known update until the federation ends;
// the faulty rank dies ("kill...") or stalls until released on its second task.
// It returns its tasks' (round, client) and what ended its loop.
func fedFaultWorker(g *pybridge.Group, key string) (tasks [][2]int, err error) {
	w, err := pybridge.NewFedWorker[float32](g)
	if err != nil {
		return nil, err
	}
	defer w.Close()
	for {
		task, ok, err := w.Next()
		if err != nil || !ok {
			return tasks, err
		}
		tasks = append(tasks, [2]int{task.Round, task.Client})
		if g.Rank() == fedFaulty && len(tasks) == 2 {
			held := fmt.Sprintf("%d %d", task.Round, task.Client)
			if err := os.WriteFile(fedFile("client-"+key), []byte(held), 0o644); err != nil {
				return tasks, err
			}
			if strings.HasPrefix(key, "kill") {
				logf("dying while holding round %d's client %d", task.Round, task.Client)
				os.Exit(3)
			}
			if err := fedWaitFile("release-" + key); err != nil { // the server saw the timeout
				return tasks, err
			}
		}
		for i := range task.Model {
			task.Model[i] += float32(task.Client+1) * fedV[i]
		}
		if err := w.Submit(task.Model, task.Client+1); err != nil {
			return tasks, err
		}
		if g.Rank() == fedFaulty && len(tasks) == 2 { // its late answer is with the server
			if err := os.WriteFile(fedFile("late-"+key), nil, 0o644); err != nil {
				return tasks, err
			}
		}
	}
}

// fedRun runs up to `rounds` rounds of fedClients from a zero model and stops at the
// first error of Next, which it returns (fault) with the results of every round.
func fedRun(s *pybridge.FedServer[float32], rounds int) (seen [][]pybridge.FedResult, model []float32, fault, err error) {
	model = make([]float32, len(fedV))
	for range rounds {
		if err := s.StartRound(fedClients, model); err != nil {
			return seen, model, nil, err
		}
		var got []pybridge.FedResult
		for {
			r, ok, err := s.Next()
			if err != nil {
				return append(seen, got), model, err, nil
			}
			if !ok {
				break
			}
			got = append(got, r)
		}
		seen = append(seen, got)
		if _, err := s.Aggregate(1.0, model); err != nil {
			return seen, model, nil, err
		}
	}
	return seen, model, nil, nil
}

// fedAnswered checks that each round answered every client once with its samples.
func fedAnswered(seen [][]pybridge.FedResult) error {
	for i, got := range seen {
		var clients []int
		for _, r := range got {
			if r.Samples != r.Client+1 || r.Round != i+1 {
				return fmt.Errorf("round %d: unexpected result %+v", i+1, r)
			}
			clients = append(clients, r.Client)
		}
		slices.Sort(clients)
		if !slices.Equal(clients, fedClients) {
			return fmt.Errorf("round %d answered clients %v", i+1, clients)
		}
	}
	return nil
}

// fedWorkersOf lists the workers that answered in the rounds given.
func fedWorkersOf(rounds [][]pybridge.FedResult) map[int]bool {
	workers := map[int]bool{}
	for _, got := range rounds {
		for _, r := range got {
			workers[r.Worker] = true
		}
	}
	return workers
}

// fedRequeued checks that the held client of round `round` was answered by a live worker
// and that the faulty worker answered nothing after that round.
func fedRequeued(seen [][]pybridge.FedResult, round, client int) error {
	for _, r := range seen[round-1] {
		if r.Client == client && r.Worker == fedFaulty {
			return fmt.Errorf("client %d of round %d was answered by the lost worker", client, round)
		}
	}
	if w := fedWorkersOf(seen[round:]); w[fedFaulty] {
		return fmt.Errorf("the lost worker answered clients after round %d: workers %v", round, w)
	}
	return nil
}

// fedFaultServer: without requeue Next must fail naming the faulty worker and its
// client (wantErr: ErrComm or ErrTimeout) and end the round; with requeue the rounds
// complete. Then the faulty worker is released and the server closes.
func fedFaultServer(g *pybridge.Group, key string, requeue bool, timeout time.Duration, rounds int, wantErr error) error {
	goroutines := runtime.NumGoroutine()
	opts := []pybridge.FedOption{pybridge.WithClientTimeout(timeout)}
	if requeue {
		opts = append(opts, pybridge.WithRequeue())
	}
	s, err := pybridge.NewFedServer[float32](g, opts...)
	if err != nil {
		return err
	}
	seen, model, fault, err := fedRun(s, rounds)
	if err != nil {
		return err
	}
	round, client, err := fedHeld(key)
	if err != nil {
		return err
	}
	if requeue {
		if fault != nil {
			return fmt.Errorf("%s: Next with requeue: %v", key, fault)
		}
		if err := fedAnswered(seen); err != nil {
			return fmt.Errorf("%s: %v", key, err)
		}
		if want := fedStep(float32(rounds)); !slices.Equal(model, want) {
			return fmt.Errorf("%s: model %v, want %v", key, model, want)
		}
		if err := fedRequeued(seen, round, client); err != nil {
			return fmt.Errorf("%s: %v", key, err)
		}
	} else {
		var fe *pybridge.FedWorkerError
		text := fmt.Sprint(fault)
		if !errors.As(fault, &fe) || !errors.Is(fault, wantErr) || fe.Worker != fedFaulty || fe.Client != client ||
			!strings.Contains(text, "rank 2") || !strings.Contains(text, fmt.Sprintf("client %d", client)) {
			return fmt.Errorf("%s: want a FedWorkerError (%v) naming worker %d and client %d, got %#v (%v)",
				key, wantErr, fedFaulty, client, fault, fault)
		}
		if wantErr == pybridge.ErrTimeout && errors.Is(fault, pybridge.ErrComm) {
			return fmt.Errorf("%s: a timeout is ErrTimeout only, got %v", key, fault)
		}
		logf("%s: %v", key, fault)
		if _, ok, err := s.Next(); ok || err != nil {
			return fmt.Errorf("%s: after the error: ok %v, err %v; want the round over", key, ok, err)
		}
		if err := fedAnswered(seen[:len(seen)-1]); err != nil { // the rounds before the loss
			return fmt.Errorf("%s: %v", key, err)
		}
	}
	if err := os.WriteFile(fedFile("release-"+key), nil, 0o644); err != nil {
		return err
	}
	stalled := !strings.HasPrefix(key, "kill")
	if stalled {
		// The stalled worker is taken back once its late answer is in, then terminated
		// by Close (which would cut it off, past its deadline, before that).
		if err := fedWaitFile("late-" + key); err != nil {
			return err
		}
		time.Sleep(300 * time.Millisecond)
	}
	if err := s.Close(); err != nil {
		return fmt.Errorf("%s: Close after the loss: %v", key, err)
	}
	if stalled {
		if err := fedWaitFile("done-" + key); err != nil {
			return err
		}
	}
	if n := runtime.NumGoroutine(); n > goroutines {
		return fmt.Errorf("%s: %d goroutines after Close, %d before the server", key, n, goroutines)
	}
	return nil
}

// fedRequeueServer: three rounds complete with requeue although worker 2 dies.
func fedRequeueServer(g *pybridge.Group) error {
	s, err := pybridge.NewFedServer[float32](g, pybridge.WithRequeue(), pybridge.WithClientTimeout(30*time.Second))
	if err != nil {
		return err
	}
	seen, model, fault, err := fedRun(s, 3)
	if err != nil || fault != nil {
		return fmt.Errorf("rounds with requeue: %v %v", err, fault)
	}
	round, client, err := fedHeld("kill-requeue")
	if err != nil {
		return err
	}
	if err := fedAnswered(seen); err != nil {
		return err
	}
	if want := fedStep(3); !slices.Equal(model, want) {
		return fmt.Errorf("model %v, want %v", model, want)
	}
	return fedRequeued(seen, round, client)
}

// fedFaultLaunch runs the fault's 4 ranks and checks their exit codes (0 unless given).
func fedFaultLaunch(t *testing.T, fault string, exits map[int]int) {
	t.Helper()
	procs := runRanks(t, &launch{
		role: "fedfault", world: 4, limit: 150 * time.Second,
		env: []string{"PB_TEST_FAULT=" + fault, "PB_TEST_DIR=" + t.TempDir()},
	})
	for _, p := range procs {
		code := 0
		var exit *exec.ExitError
		if errors.As(p.err, &exit) {
			code = exit.ExitCode()
		} else if p.err != nil {
			code = -1
		}
		if code != exits[p.rank] {
			t.Fatalf("rank %d exited with %d (%v), want %d\n%s", p.rank, code, p.err, exits[p.rank], dump(procs))
		}
	}
	t.Logf("\n%s", dump(procs))
}

func TestFederatedDeadWorkerIsNamedAndTheServerClosesCleanly(t *testing.T) {
	fedFaultLaunch(t, "kill", map[int]int{fedFaulty: 3})
}

func TestFederatedRequeueAfterAWorkerDiesAndWorkersSeeTheServerDie(t *testing.T) {
	fedFaultLaunch(t, "kill-requeue", map[int]int{0: 4, fedFaulty: 3})
}

func TestFederatedStalledWorkerTimesOutOrIsRequeued(t *testing.T) {
	fedFaultLaunch(t, "stall", nil)
}
