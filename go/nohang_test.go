package pybridge_test

import (
	"errors"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	pybridge "github.com/pybridge/pybridge/go"
	"github.com/pybridge/pybridge/go/recordio"
)

// within runs fn, failing the test if it has not returned after limit (a hang).
func within(t *testing.T, limit time.Duration, what string, fn func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return err
	case <-time.After(limit):
		t.Fatalf("%s did not return within %v", what, limit)
		return nil
	}
}

// A file:// rendezvous in a directory that does not exist fails at once, naming it.
func TestInitFileStoreMissingDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "no-such-dir")
	err := within(t, 60*time.Second, "Init", func() error {
		g, err := pybridge.Init(pybridge.WithInitMethod("file://"+dir+"/store"), pybridge.WithRank(0),
			pybridge.WithWorldSize(2), pybridge.WithTimeout(5*time.Second))
		if err == nil {
			g.Close()
		}
		return err
	})
	if !errors.Is(err, pybridge.ErrInvalidArgument) || !strings.Contains(err.Error(), dir+" does not exist") {
		t.Fatalf("got %v, want ErrInvalidArgument naming %s", err, dir)
	}
}

// A FIFO (whose open blocks until a writer comes) or a directory is refused by
// the loader and by the pure Go reader, naming what it is.
func TestNonRegularFilesRefused(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "pipe.recordio")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	err := within(t, 60*time.Second, "OpenLoader", func() error {
		_, err := pybridge.OpenLoader(nil, []string{fifo}, 2)
		return err
	})
	if !errors.Is(err, pybridge.ErrIO) || !strings.Contains(err.Error(), "not a regular file but a FIFO") {
		t.Fatalf("OpenLoader on a FIFO: got %v, want ErrIO naming the FIFO", err)
	}
	for _, path := range []string{fifo, dir} {
		err = within(t, 10*time.Second, "recordio.Open", func() error {
			r, err := recordio.Open(path)
			if err == nil {
				r.Close()
			}
			return err
		})
		if !errors.Is(err, recordio.ErrNotRegular) {
			t.Fatalf("recordio.Open(%s): got %v, want ErrNotRegular", path, err)
		}
		err = within(t, 10*time.Second, "recordio.Index", func() error {
			_, err := recordio.Index(path)
			return err
		})
		if !errors.Is(err, recordio.ErrNotRegular) {
			t.Fatalf("recordio.Index(%s): got %v, want ErrNotRegular", path, err)
		}
	}
}
