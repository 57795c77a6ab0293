package main

import (
	"fmt"
	"math/rand"
	"path/filepath"

	pybridge "github.com/pybridge/pybridge/go"
	"github.com/pybridge/pybridge/go/recordio"
)

// Federated worker (-federated): a worker rank of federated_go.py's Python server.
// It holds the whole training split, learns from the server which client owns
// each record, then trains or evaluates the clients the server hands it with the
// Go MLP of model.go: local SGD (no momentum) in batches of -batch-size for
// -local-epochs passes, as federated.py's Python workers do.

func runFederatedWorker(opts options) error {
	g, err := pybridge.Init(pybridge.WithBackend("gloo"))
	if err != nil {
		return err
	}
	defer g.Close()
	if g.Rank() == 0 {
		return fmt.Errorf("-federated runs a worker; rank 0 is the server: launch examples/mnist/federated_go.py")
	}
	records, err := readAll(filepath.Join(opts.Data, "train-*.recordio"))
	if err != nil {
		return err
	}
	x, labels, err := decodeBatch(records)
	if err != nil {
		return err
	}
	clients, err := receiveSplit(g, len(labels))
	if err != nil {
		return err
	}
	w, err := pybridge.NewFedWorker[float32](g)
	if err != nil {
		return err
	}
	defer w.Close()
	for tasks := 0; ; tasks++ {
		task, ok, err := w.Next()
		if err != nil {
			return err
		}
		if !ok { // the server ended the federation
			fmt.Printf("federated worker rank %d (Go): %d tasks\n", g.Rank(), tasks)
			return nil
		}
		m, err := mlpOver(task.Model)
		idx := clients[task.Client]
		if err == nil && len(idx) == 0 {
			err = fmt.Errorf("client %d has no records here", task.Client)
		}
		if err != nil {
			if err := w.Fail(err.Error()); err != nil {
				return err
			}
			continue
		}
		if task.Command == pybridge.FedEvaluate {
			loss, correct := evaluateClient(m, x, labels, idx)
			err = w.Submit([]float32{float32(loss), float32(correct)}, len(idx))
		} else {
			trainClient(m, x, labels, idx, opts, task.Client)
			err = w.Submit(task.Model, len(idx)) // m's parameters are views of task.Model
		}
		if err != nil {
			return err
		}
	}
}

// readAll returns every record of the files matching pattern, in name order (as
// the Python side's recordio.expand_files reads them).
func readAll(pattern string) ([][]byte, error) {
	files, err := filepath.Glob(pattern)
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("no files match %s", pattern)
	}
	var out [][]byte
	for _, f := range files {
		r, err := recordio.Open(f)
		if err != nil {
			return nil, err
		}
		for r.Next() {
			out = append(out, append([]byte(nil), r.Record()...))
		}
		err = r.Err()
		r.Close()
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// receiveSplit takes the server's broadcast of which client owns each record
// and returns each client's record indices.
func receiveSplit(g *pybridge.Group, n int) (map[int][]int, error) {
	count := []int64{0}
	if err := pybridge.Broadcast(g, count, 0); err != nil {
		return nil, err
	}
	if count[0] != int64(n) {
		return nil, fmt.Errorf("the server's training split has %d records, this worker read %d", count[0], n)
	}
	owner := make([]int32, n)
	if err := pybridge.Broadcast(g, owner, 0); err != nil {
		return nil, err
	}
	clients := map[int][]int{}
	for i, c := range owner {
		clients[int(c)] = append(clients[int(c)], i)
	}
	return clients, nil
}

// mlpOver returns an MLP whose parameters are views of flat, laid out as
// torch's parameters_to_vector lays out federated.py's model: W1, B1, W2, B2.
func mlpOver(flat []float32) (*MLP, error) {
	per := imageSize + 1 + numClasses
	h := (len(flat) - numClasses) / per
	if h < 1 || h*per+numClasses != len(flat) {
		return nil, fmt.Errorf("a model of %d floats is not a 784-H-10 MLP", len(flat))
	}
	at := 0
	take := func(n int) []float32 {
		s := flat[at : at+n : at+n]
		at += n
		return s
	}
	return &MLP{Hidden: h, W1: take(h * imageSize), B1: take(h), W2: take(numClasses * h), B2: take(numClasses)}, nil
}

// gather copies the records idx into one batch.
func gather(x []float32, labels []uint8, idx []int) ([]float32, []uint8) {
	bx, bl := make([]float32, len(idx)*imageSize), make([]uint8, len(idx))
	for n, i := range idx {
		copy(bx[n*imageSize:(n+1)*imageSize], x[i*imageSize:(i+1)*imageSize])
		bl[n] = labels[i]
	}
	return bx, bl
}

// trainClient runs local SGD on the client's records, in place on m (with
// -prox-mu, FedProx: the gradient of mu/2 ||w - w_round||^2 is added).
func trainClient(m *MLP, x []float32, labels []uint8, idx []int, opts options, client int) {
	rng := rand.New(rand.NewSource(opts.Seed*100003 + int64(client)))
	params := m.Params()
	var round [][]float32 // the round's model, for FedProx
	if opts.proxMu > 0 {
		for _, p := range params {
			round = append(round, append([]float32(nil), p...))
		}
	}
	grads := make(Grads, len(params))
	for i, p := range params {
		grads[i] = make([]float32, len(p))
	}
	opt := &SGD{LR: float32(opts.LR)}
	none := func(int) error { return nil }
	for e := 0; e < opts.localEpochs; e++ {
		perm := rng.Perm(len(idx))
		for at := 0; at < len(perm); at += opts.BatchSize {
			batch := make([]int, 0, opts.BatchSize)
			for _, k := range perm[at:min(at+opts.BatchSize, len(perm))] {
				batch = append(batch, idx[k])
			}
			bx, bl := gather(x, labels, batch)
			act, _, _ := m.forward(bx, bl)
			_ = m.backward(act, grads, none) // none never fails
			for i := range round {
				_ = pybridge.FedProxGrad(grads[i], params[i], round[i], opts.proxMu) // same lengths; mu checked by parseFlags
			}
			opt.Step(params, grads)
		}
	}
}

// evaluateClient returns the summed loss and the correct predictions of m on
// the client's records (the metrics federated.py's server expects).
func evaluateClient(m *MLP, x []float32, labels []uint8, idx []int) (loss float64, correct int) {
	for at := 0; at < len(idx); at += evalBatch {
		batch := idx[at:min(at+evalBatch, len(idx))]
		bx, bl := gather(x, labels, batch)
		_, l, c := m.forward(bx, bl)
		loss += l * float64(len(batch))
		correct += c
	}
	return loss, correct
}
