// Package mnistdata is what the MNIST trainers of examples/ share (the Go trainer in
// examples/mnist and the GoTorch-style one in examples/gotorch): the record layout,
// the data folder prepare.py writes and its loaders, a rank's share of the test set,
// the progress lines and the weights file. mnist_format.py is the one definition of
// the formats; this package restates them for Go.
package mnistdata

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	pybridge "github.com/pybridge/pybridge/go"
)

// The record layout: one label byte, then 28x28 pixel bytes, row-major.
const (
	ImageSize  = 28 * 28
	RecordSize = 1 + ImageSize
	NumClasses = 10
	EvalBatch  = 256 // test records per rank and batch
)

// Training holds the flags every MNIST trainer takes, with the same defaults and
// meaning (train.py takes them too).
type Training struct {
	Data, SaveWeights        string
	Epochs, BatchSize, Steps int
	LR, Momentum             float64
	Seed                     int64
}

// Register adds the flags to fs.
func (t *Training) Register(fs *flag.FlagSet) {
	fs.StringVar(&t.Data, "data", "data/mnist", "folder written by examples/mnist/prepare.py")
	fs.IntVar(&t.Epochs, "epochs", 5, "epochs")
	fs.IntVar(&t.BatchSize, "batch-size", 64, "GLOBAL batch: records per step over all ranks, divisible by the world size")
	fs.Float64Var(&t.LR, "lr", 0.05, "learning rate")
	fs.Float64Var(&t.Momentum, "momentum", 0.9, "SGD momentum")
	fs.Int64Var(&t.Seed, "seed", 1, "initial parameters and data order")
	fs.IntVar(&t.Steps, "steps", -1, "stop after this many global steps in all (-1: no limit)")
	fs.StringVar(&t.SaveWeights, "save-weights", "", "rank 0 writes the final parameters and momentum here (mnist_format.py)")
}

// Check refuses values no run can use.
func (t *Training) Check() error {
	if t.Epochs < 1 || t.BatchSize < 1 {
		return errors.New("--epochs and --batch-size must be positive")
	}
	return nil
}

// Kind says which data a prepared folder holds, from its manifest.json.
func Kind(folder string) string {
	raw, err := os.ReadFile(filepath.Join(folder, "manifest.json"))
	if err != nil {
		return "unknown data (no manifest.json)"
	}
	var m struct{ Kind string }
	if json.Unmarshal(raw, &m) != nil {
		return "unknown data (unreadable manifest.json)"
	}
	switch m.Kind {
	case "synthetic":
		return "synthetic digits (SYNTHETIC: not real MNIST)"
	case "mnist":
		return "real MNIST"
	}
	return m.Kind
}

// Shards lists the folder's files matching pattern, sorted by name.
func Shards(folder, pattern string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(folder, pattern))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no %s in %s: run examples/mnist/prepare.py first", pattern, folder)
	}
	sort.Strings(files)
	return files, nil
}

// Say returns a Printf (with a newline) that prints on rank 0 only.
func Say(rank int) func(format string, a ...any) {
	return func(format string, a ...any) {
		if rank == 0 {
			fmt.Printf(format+"\n", a...)
		}
	}
}

// PerRank is a rank's share of the global batch, which the world size must divide.
func PerRank(global, world int) (int, error) {
	if global%world != 0 {
		return 0, fmt.Errorf("--batch-size %d is the global batch and must be divisible by the world size %d",
			global, world)
	}
	return global / world, nil
}

// Data is a rank's view of a prepared folder: its share of the training shards
// (shuffled by chunk with the seed and the epoch, last partial batch dropped) and
// its static share of the test shards.
type Data struct {
	Folder        string
	Train, Test   *pybridge.Loader
	StepsPerEpoch int  // per rank; under the dynamic partition the average
	Dynamic       bool // the training partition is dynamic: batch counts differ by rank
}

// Open opens the loaders with the static training partition: perRank training
// records a step, global the batch over all ranks.
func Open(g *pybridge.Group, folder string, perRank, global int, seed int64) (*Data, error) {
	return OpenPartition(g, folder, perRank, global, seed, pybridge.StaticPartition)
}

// OpenPartition is Open with the training partition chosen: under
// DynamicPartition the ranks claim chunks as they go, so a faster rank reads
// more batches, and every rank must join (Reducer.Join) when its loader has no
// more.
func OpenPartition(g *pybridge.Group, folder string, perRank, global int, seed int64, part pybridge.Partition) (*Data, error) {
	trainFiles, err := Shards(folder, "train-*.recordio")
	if err != nil {
		return nil, err
	}
	testFiles, err := Shards(folder, "test-*.recordio")
	if err != nil {
		return nil, err
	}
	d := &Data{Folder: folder, Dynamic: part == pybridge.DynamicPartition}
	if d.Train, err = pybridge.OpenLoader(g, trainFiles, perRank, pybridge.WithShuffle(seed), pybridge.WithDropLast(),
		pybridge.WithPartition(part)); err != nil {
		return nil, err
	}
	if d.Test, err = pybridge.OpenLoader(g, testFiles, EvalBatch); err != nil {
		d.Train.Close()
		return nil, err
	}
	if d.StepsPerEpoch, err = d.Train.NumBatches(); d.Dynamic {
		d.StepsPerEpoch = d.Train.NumRecords() / global
	}
	if err == nil && d.StepsPerEpoch == 0 {
		err = fmt.Errorf("%d training records are too few for a global batch of %d", d.Train.NumRecords(), global)
	}
	if err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// Close closes both loaders.
func (d *Data) Close() {
	d.Train.Close()
	d.Test.Close()
}

// Header is the first line the trainers print.
func (d *Data) Header(world, global int, lr, momentum float64) string {
	about := ""
	if d.Dynamic {
		about = "~" // a rank's steps depend on its pace
	}
	return fmt.Sprintf("data: %s, train %d, test %d | %d ranks, global batch %d (%d per rank), %s%d steps/epoch, lr %g, momentum %g",
		Kind(d.Folder), d.Train.NumRecords(), d.Test.NumRecords(), world, global, global/world, about, d.StepsPerEpoch, lr, momentum)
}

// EpochLine is the line printed after each epoch (train.py prints the same).
func EpochLine(epoch, epochs int, loss, acc, samplesPerSecond float64, rank, world int) string {
	return fmt.Sprintf("epoch %d/%d  loss %.4f  test-acc %.4f  samples/s %.0f  (rank %d of %d)", epoch, epochs,
		loss, acc, samplesPerSecond, rank, world)
}

// Evaluate passes this rank's share of the test set to count, batch by batch, and
// sums what it returns (the right predictions). The loader pads the ranks' shares to
// equal size with wrap-around records; those are excluded, so every test record counts
// once over all ranks.
func Evaluate(g *pybridge.Group, test *pybridge.Loader, count func(records [][]byte) (int, error)) (correct, counted int, err error) {
	n, w, r := test.NumRecords(), g.Size(), g.Rank()
	share := (n + w - 1) / w
	valid := max(0, min(share, n-r*share))
	for test.Next() {
		if counted >= valid {
			continue // keep reading: the pass must end cleanly
		}
		recs := test.Batch().Records()
		if take := valid - counted; len(recs) > take {
			recs = recs[:take]
		}
		c, err := count(recs)
		if err != nil {
			return 0, 0, err
		}
		correct += c
		counted += len(recs)
	}
	return correct, counted, test.Err()
}

// Magic starts a weights (checkpoint) file.
var Magic = []byte("PBMLP01\n")

// WriteWeights writes epochs and steps completed and the tensors with their shapes
// (row-major float32, little-endian), atomically: a temporary file, then a rename.
func WriteWeights(path string, epoch, step int, shapes [][]int, tensors [][]float32) error {
	var buf bytes.Buffer
	buf.Write(Magic)
	binary.Write(&buf, binary.LittleEndian, [2]uint64{uint64(epoch), uint64(step)})
	binary.Write(&buf, binary.LittleEndian, uint32(len(tensors)))
	for i, t := range tensors {
		binary.Write(&buf, binary.LittleEndian, uint32(len(shapes[i])))
		for _, d := range shapes[i] {
			binary.Write(&buf, binary.LittleEndian, uint32(d))
		}
		binary.Write(&buf, binary.LittleEndian, t)
	}
	tmp := fmt.Sprintf("%s.tmp%d", path, os.Getpid())
	if err := os.WriteFile(tmp, buf.Bytes(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
