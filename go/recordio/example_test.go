package recordio_test

import (
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/pybridge/pybridge/go/recordio"
)

// Write a RecordIO file from Go and read it back; Python's pybridge.recordio and
// GoTorch's Go library read the same bytes.
func ExampleWriter() {
	dir, err := os.MkdirTemp("", "recordio-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "words.recordio")

	w, err := recordio.Create(path, recordio.Snappy)
	if err != nil {
		log.Fatal(err)
	}
	for _, word := range []string{"alpha", "beta", "gamma"} {
		if err := w.Write([]byte(word)); err != nil {
			log.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		log.Fatal(err)
	}

	r, err := recordio.Open(path)
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	for r.Next() {
		fmt.Println(string(r.Record()))
	}
	if err := r.Err(); err != nil {
		log.Fatal(err)
	}
	// Output:
	// alpha
	// beta
	// gamma
}
