package pybridge_test

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	pybridge "github.com/pybridge/pybridge/go"
)

func init() { roles["words"] = roleWords }

// notGo matches what a Go error's message must not hold: Python's spellings (a call
// name(), a keyword name=, a torch type, Python's exception names, notes for other
// languages) and C's (pb_ functions and types, PB_ constants).
var notGo = regexp.MustCompile(`\w\(\)|\b[a-z_]+=|torch\.|MembershipChanged|\(C: |Go: |\b(pb|PB)_\w+`)

// inGo checks that err is want and that its message holds words, in Go's names only.
func inGo(what string, err, want error, words ...string) error {
	var pe *pybridge.Error
	if !errors.Is(err, want) || !errors.As(err, &pe) {
		return fmt.Errorf("%s: got %v, want %v", what, err, want)
	}
	for _, w := range words {
		if !strings.Contains(pe.Msg, w) {
			return fmt.Errorf("%s: %q lacks %q", what, pe.Msg, w)
		}
	}
	if m := notGo.FindString(pe.Msg); m != "" {
		return fmt.Errorf("%s: %q says %q, not Go's name", what, pe.Msg, m)
	}
	return nil
}

// TestErrorWords: library errors met without a process group name Go's types and constants.
func TestErrorWords(t *testing.T) {
	invalid := pybridge.ErrInvalidArgument
	_, err := pybridge.NewBuffer[int32](1 << 62)
	if err := inGo("NewBuffer 2^62", err, invalid, "of int32 is"); err != nil {
		t.Error(err)
	}
	files, _ := writeDataset(t, t.TempDir(), 1, 8)
	_, err = pybridge.OpenLoader(nil, files, 2, pybridge.WithPartition(9))
	if err := inGo("OpenLoader partition 9", err, invalid, "StaticPartition (0) or DynamicPartition (1)"); err != nil {
		t.Error(err)
	}
	l, err := pybridge.OpenLoader(nil, files, 2, pybridge.WithPartition(pybridge.DynamicPartition))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ck := pybridge.NewCheckpoint(nil, t.TempDir(), pybridge.WithLoader(l))
	if err := pybridge.AddTensor(ck, "w", []float32{1, 2}); err != nil {
		t.Fatal(err)
	}
	if err := inGo("Checkpoint.Save of a dynamic loader", ck.Save(1), invalid, "with StaticPartition"); err != nil {
		t.Error(err)
	}
}

func TestErrorWordsRank(t *testing.T) {
	expectPass(t, runRanks(t, &launch{role: "words", world: 1, limit: 90 * time.Second}))
}

func roleWords() error {
	g, err := pybridge.Init(pybridge.WithBackend("gloo"), pybridge.WithTimeout(30*time.Second))
	if err != nil {
		return err
	}
	defer g.Close()
	invalid := pybridge.ErrInvalidArgument
	_, err = pybridge.Init()
	checks := []error{
		inGo("second Init", err, pybridge.ErrAlreadyInitialized, "call Group.Close first"),
		inGo("AllReduce Avg on int32", pybridge.AllReduce(g, []int32{1, 2}, pybridge.Avg), invalid, "got int32"),
	}
	r, err := pybridge.NewReducer(g, pybridge.Params[float32](4, 2))
	if err != nil {
		return err
	}
	defer r.Close()
	ck := pybridge.NewCheckpoint(g, "", pybridge.WithReducer(r))
	if err := pybridge.AddTensor(ck, "w", []float32{1, 2}); err != nil {
		return err
	}
	st, err := pybridge.NewElasticState(ck)
	if err != nil {
		return err
	}
	defer st.Close()
	_, err = st.Restore()
	checks = append(checks, inGo("ElasticState.Restore before Commit", err, invalid, "(ElasticState.Commit)"))
	if err := st.Commit(1); err != nil {
		return err
	}
	bufs := make([]pybridge.TensorSource, 2)
	for i, n := range []int{4, 2} {
		b, err := pybridge.NewBuffer[float32](n)
		if err != nil {
			return err
		}
		defer b.Close()
		bufs[i] = b.Tensor()
	}
	// An iteration under way: calls that belong between iterations name themselves.
	if err := r.MarkReady(0); err != nil {
		return err
	}
	_, err = st.Restore()
	checks = append(checks,
		inGo("MarkReady twice", r.MarkReady(0), invalid, "between Reducer.Wait calls"),
		inGo("BindGrads in an iteration", r.BindGrads(bufs), invalid, "Reducer.BindGrads must be called between"),
		inGo("ElasticState.Restore in an iteration", err, invalid, "ElasticState.Restore must be called between"),
		inGo("Wait with a gradient unmarked", r.Wait(10*time.Second), invalid, "create the reducer with WithAllowUnused so"),
		inGo("Join without WithJoin", joinErr(r.Join()), invalid, "Reducer.Join needs a reducer created with WithJoin"),
	)
	return errors.Join(checks...)
}

func joinErr(_ pybridge.JoinResult, err error) error { return err }
