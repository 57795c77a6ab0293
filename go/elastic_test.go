package pybridge_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	pybridge "github.com/pybridge/pybridge/go"
)

func init() {
	roles["elastic"] = roleElastic
	world2.share("elastic", "TestElasticState2Ranks")
}

// An elastic state over a Checkpoint's slices: commit, roll back, and rank 0's
// commit sent to rank 1 (a joiner with a fresh model) over the network.
func TestElasticState2Ranks(t *testing.T) {
	expectRolePass(t, world2, "elastic")
}

func roleElastic() error {
	g, err := initRole(pybridge.WithBackend("gloo"), pybridge.WithTimeout(60*time.Second))
	if err != nil {
		return err
	}
	defer g.Close()
	w := make([]float32, 3)
	if g.Rank() == 0 {
		copy(w, []float32{1, 2, 3})
	}
	ck := pybridge.NewCheckpoint(g, "")
	if err := pybridge.AddTensor(ck, "w", w); err != nil {
		return err
	}
	st, err := pybridge.NewElasticState(ck)
	if err != nil {
		return err
	}
	if g.Rank() == 0 {
		if _, err := st.Restore(); !errors.Is(err, pybridge.ErrInvalidArgument) {
			return fmt.Errorf("Restore before any Commit: %v", err)
		}
		if err := st.Commit(5); err != nil {
			return err
		}
		w[0] = 9
		step, err := st.Restore()
		if err != nil || step != 5 || !slices.Equal(w, []float32{1, 2, 3}) {
			return fmt.Errorf("Restore: step %d, w %v, %v", step, w, err)
		}
		w[1] = 7 // not committed: Sync rolls the root back too
	}
	step, err := st.Sync(g, 0)
	if err != nil || step != 5 || !slices.Equal(w, []float32{1, 2, 3}) {
		return fmt.Errorf("Sync: step %d, w %v, %v", step, w, err)
	}
	// A world made by Init is not elastic: Reset says so and leaves it live.
	if ng, _, err := st.Reset(); ng != nil || !errors.Is(err, pybridge.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "not in an elastic job (join it with ElasticInit)") {
		return fmt.Errorf("Reset on a non-elastic world: %v, %v", ng, err)
	}
	if _, err := pybridge.LastElasticChange(); !errors.Is(err, pybridge.ErrInvalidArgument) {
		return fmt.Errorf("LastElasticChange outside an elastic job: %v", err)
	}
	if err := g.Barrier(); err != nil {
		return fmt.Errorf("Barrier after the refused Reset: %v", err)
	}
	if err := st.Close(); err != nil {
		return err
	}
	if err := st.Commit(6); !errors.Is(err, pybridge.ErrClosed) {
		return fmt.Errorf("Commit after Close: %v", err)
	}
	return nil
}

// ElasticInit takes the options it can honour and no other (a compile-time check:
// Init's own options are not ElasticOptions), and WithElasticStore is not Init's.
func TestElasticInitOptions(t *testing.T) {
	for name, o := range map[string]pybridge.Option{"rank": pybridge.WithRank(1), "checked": pybridge.WithChecked(),
		"init method": pybridge.WithInitMethod("env://"), "watchdog": pybridge.WithWatchdog(0),
		"world size": pybridge.WithWorldSize(2), "local rank": pybridge.WithLocalRank(0)} {
		if _, ok := o.(pybridge.ElasticOption); ok {
			t.Errorf("%s is an ElasticOption: ElasticInit would take it", name)
		}
	}
	if _, ok := pybridge.WithElasticStore("h:1").(pybridge.Option); ok {
		t.Error("WithElasticStore is an Option: Init would take it and ignore it")
	}
	var _ []pybridge.ElasticOption = []pybridge.ElasticOption{pybridge.WithBackend("gloo"), // both take them
		pybridge.WithTimeout(time.Second), pybridge.WithElasticStore("h:1")}
	if _, err := pybridge.RunElastic(nil, nil, nil); !errors.Is(err, pybridge.ErrInvalidArgument) {
		t.Errorf("RunElastic with a nil train: %v", err)
	}
	var st *pybridge.ElasticState
	if g, _, err := st.Reset(); g != nil || !errors.Is(err, pybridge.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "nil *ElasticState") {
		t.Errorf("Reset on a nil state: %v, %v", g, err)
	}
}
