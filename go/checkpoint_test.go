package pybridge_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	pybridge "github.com/pybridge/pybridge/go"
)

func init() { roles["checkpoint"] = roleCheckpoint }

func TestCheckpointSingleProcess(t *testing.T) {
	dir := t.TempDir()
	c := pybridge.NewCheckpoint(nil, dir)
	w := []float32{1, 2, 3}
	n := []int64{7}
	if err := pybridge.AddTensor(c, "w", w); err != nil {
		t.Fatal(err)
	}
	if err := pybridge.AddTensor(c, "n", n); err != nil {
		t.Fatal(err)
	}
	if err := pybridge.AddTensor(c, "w", w); !errors.Is(err, pybridge.ErrInvalidArgument) {
		t.Fatalf("a name twice: %v", err)
	}
	if step, found, err := c.Restore(); err != nil || found || step != -1 {
		t.Fatalf("empty folder: step %d found %v err %v", step, found, err)
	}
	for step := int64(1); step <= 3; step++ {
		w[0] = float32(step)
		if err := c.Save(step); err != nil {
			t.Fatal(err)
		}
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "step-*.pt")); len(files) != 2 {
		t.Fatalf("kept %v, want the newest 2", files)
	}
	w[0], w[1], n[0] = 0, 0, 0
	if step, found, err := c.Restore(); err != nil || !found || step != 3 {
		t.Fatalf("restore: step %d found %v err %v", step, found, err)
	}
	if !slices.Equal(w, []float32{3, 2, 3}) || n[0] != 7 {
		t.Fatalf("restored w %v n %v", w, n)
	}
	other := pybridge.NewCheckpoint(nil, dir)
	if err := pybridge.AddTensor(other, "w", make([]float64, 3)); err != nil {
		t.Fatal(err)
	}
	_ = pybridge.AddTensor(other, "n", n)
	if _, _, err := other.Restore(); !errors.Is(err, pybridge.ErrInvalidArgument) || !strings.Contains(err.Error(), "'w'") {
		t.Fatalf("float64 into a float32 checkpoint: %v", err)
	}
	if err := c.Save(-1); !errors.Is(err, pybridge.ErrInvalidArgument) {
		t.Fatalf("negative step: %v", err)
	}
}

// 4 ranks read 4 batches of epoch 1 each and stop; 2 ranks restore (from rank
// 1's folder: rank 0 saved only up to step 3), read the rest of epoch 1 and then
// epoch 2. Each epoch's records are read once.
func TestCheckpointResumeOnFewerRanks(t *testing.T) {
	dir := t.TempDir()
	_, all := writeDataset(t, dir, 3, 40)
	for _, world := range []int{4, 2} {
		procs := runRanks(t, &launch{role: "checkpoint", world: world, limit: 120 * time.Second,
			env: []string{"PB_TEST_CKPT_DIR=" + dir}})
		expectPass(t, procs)
	}
	// Epoch 1: 4 ranks, then 2; epoch 2: 2 ranks.
	for epoch, pattern := range map[int]string{1: "seen-*-e1", 2: "seen-2-*-e2"} {
		files, _ := filepath.Glob(filepath.Join(dir, pattern))
		var seen []string
		for _, f := range files {
			var recs []string
			b, err := os.ReadFile(f)
			if err == nil {
				err = json.Unmarshal(b, &recs)
			}
			if err != nil {
				t.Fatal(err)
			}
			seen = append(seen, recs...)
		}
		if len(seen) != len(all) || !slices.Equal(dedup(seen), dedup(all)) {
			t.Fatalf("epoch %d: read %d records (%d distinct) of %d, from %v", epoch, len(seen), len(dedup(seen)), len(all), files)
		}
	}
}

func roleCheckpoint() error {
	g, err := pybridge.Init(pybridge.WithBackend("gloo"), pybridge.WithTimeout(60*time.Second))
	if err != nil {
		return err
	}
	defer g.Close()
	dir := os.Getenv("PB_TEST_CKPT_DIR")
	files, err := filepath.Glob(filepath.Join(dir, "part-*.recordio"))
	if err != nil || len(files) != 3 {
		return fmt.Errorf("dataset files: %v %v", files, err)
	}
	l, err := pybridge.OpenLoader(g, files, 3, pybridge.WithShuffle(5))
	if err != nil {
		return err
	}
	defer l.Close()
	c := pybridge.NewCheckpoint(g, filepath.Join(dir, "ck", "rank"+strconv.Itoa(g.Rank())), pybridge.WithLoader(l))
	total := []float64{0} // records trained on so far, over all ranks
	if err := pybridge.AddTensor(c, "total", total); err != nil {
		return err
	}
	step, found, err := c.Restore()
	if err != nil {
		return err
	}
	if g.Size() == 4 && found {
		return fmt.Errorf("first run found a checkpoint of step %d", step)
	}
	if g.Size() == 2 && (step != 4 || total[0] != 48) {
		return fmt.Errorf("restored step %d (found %v) with total %v, want step 4 from rank 1's folder and 48", step, found, total)
	}
	first := 1 // the first run starts at epoch 1, so that restoring epoch 1 is not the default 0
	if found {
		if first, err = l.Epoch(); err != nil || first != 1 {
			return fmt.Errorf("restored loader at epoch %d (%v), want 1", first, err)
		}
	}
	step = max(step, 0)
	for epoch := first; epoch < 3 && !(g.Size() == 4 && step == 4); epoch++ {
		if err := l.SetEpoch(epoch); err != nil { // the restored epoch keeps its position
			return err
		}
		var recs []string
		for l.Next() {
			b := l.Batch()
			for i := range b.Len() {
				recs = append(recs, string(b.Record(i)))
			}
			n := []float64{float64(b.Len())}
			if err := pybridge.AllReduce(g, n, pybridge.Sum); err != nil {
				return err
			}
			total[0] += n[0]
			step++
			if !(g.Rank() == 0 && step == 4) { // rank 0's newest is older: rank 1 must send step 4
				if err := c.Save(step); err != nil {
					return err
				}
			}
			if g.Size() == 4 && step == 4 {
				break
			}
		}
		if err := l.Err(); err != nil {
			return err
		}
		out, _ := json.Marshal(recs)
		name := filepath.Join(dir, fmt.Sprintf("seen-%d-%d-e%d", g.Size(), g.Rank(), epoch))
		if err := os.WriteFile(name, out, 0o644); err != nil {
			return err
		}
	}
	// 2 ranks: 72 records of epoch 1 left, 36 per rank (12 batches of 3), then 60 per rank.
	if g.Size() == 2 && step != 4+12+20 {
		return fmt.Errorf("ended at step %d, want 36", step)
	}
	return g.Close()
}
