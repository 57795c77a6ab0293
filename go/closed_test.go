package pybridge_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	pybridge "github.com/pybridge/pybridge/go"
)

func init() { roles["afterclose"] = roleAfterClose }

// TestUseAfterFinalize: a reducer and a dynamic loader made from the world group answer
// ErrClosed once the group is finalized, on 1 rank (no collective notices) and on 2.
func TestUseAfterFinalize(t *testing.T) {
	files, _ := writeDataset(t, t.TempDir(), 2, 10)
	for _, world := range []int{1, 2} {
		procs := runRanks(t, &launch{role: "afterclose", world: world, limit: 90 * time.Second,
			env: []string{"PB_TEST_FILES=" + strings.Join(files, ",")}})
		expectPass(t, procs)
	}
}

func roleAfterClose() error {
	files := strings.Split(os.Getenv("PB_TEST_FILES"), ",")
	g, err := pybridge.Init(pybridge.WithBackend("gloo"), pybridge.WithTimeout(30*time.Second))
	if err != nil {
		return err
	}
	// A seed of -1 is refused when the loader is opened, not at its first batch.
	if _, err := pybridge.OpenLoader(g, files, 4, pybridge.WithShuffle(-1)); !errors.Is(err, pybridge.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "seed") {
		return fmt.Errorf("OpenLoader WithShuffle(-1): got %v, want ErrInvalidArgument naming the seed", err)
	}
	r, err := pybridge.NewReducer(g, pybridge.Params[float32](3, 2))
	if err != nil {
		return err
	}
	defer r.Close()
	if err := r.MarkReady(0); err != nil {
		return err
	}
	l, err := pybridge.OpenLoader(g, files, 4, pybridge.WithPartition(pybridge.DynamicPartition))
	if err != nil {
		return err
	}
	defer l.Close()
	if err := g.Close(); err != nil {
		return err
	}
	if err := expect("MarkReady after finalize", r.MarkReady(1), pybridge.ErrClosed); err != nil {
		return err
	}
	if err := expect("Wait after finalize", r.Wait(5*time.Second), pybridge.ErrClosed); err != nil {
		return err
	}
	if l.Next() {
		return errors.New("Loader.Next after finalize returned a batch")
	}
	return expect("Loader.Next after finalize", l.Err(), pybridge.ErrClosed)
}
