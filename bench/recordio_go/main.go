// Command recordio_go is the Go side of bench/recordio.py: it reads a RecordIO
// file through the bridge (pybridge.OpenLoader: one process, static
// partition, the core's prefetch thread) and prints the best of REPEAT passes
// as JSON. Each timed pass opens the loader, reads every batch, touches every
// record and closes the loader, as the Python loader row does. PREFETCH
// (default 2, the loader's default) is passed as WithPrefetch.
//
// Usage:
//
//	recordio_go REPEAT BATCH FILE [PREFETCH]
package main

import (
	"encoding/json"
	"fmt"
	"log"
	"os"
	"strconv"
	"time"

	pybridge "github.com/pybridge/pybridge/go"
)

func pass(path string, batch, prefetch int) (records, nbytes int, sum byte, err error) {
	l, err := pybridge.OpenLoader(nil, []string{path}, batch, pybridge.WithPrefetch(prefetch))
	if err != nil {
		return 0, 0, 0, err
	}
	defer l.Close()
	for l.Next() {
		b := l.Batch()
		n := b.Len()
		for i := 0; i < n; i++ {
			r := b.Record(i)
			if len(r) > 0 {
				sum ^= r[0] // touch each record, as a consumer would
			}
		}
		records += n
		nbytes += len(b.Data())
	}
	return records, nbytes, sum, l.Err()
}

func main() {
	if len(os.Args) != 4 && len(os.Args) != 5 {
		log.Fatalf("usage: %s REPEAT BATCH FILE [PREFETCH]", os.Args[0])
	}
	repeat, err1 := strconv.Atoi(os.Args[1])
	batch, err2 := strconv.Atoi(os.Args[2])
	prefetch, err3 := 2, error(nil)
	if len(os.Args) == 5 {
		prefetch, err3 = strconv.Atoi(os.Args[4])
	}
	if err1 != nil || err2 != nil || err3 != nil || repeat < 1 || batch < 1 || prefetch < 0 {
		log.Fatalf("bad REPEAT, BATCH or PREFETCH: %q", os.Args[1:])
	}
	path := os.Args[3]
	if _, _, _, err := pass(path, batch, prefetch); err != nil { // warm-up: starts the embedded core
		log.Fatal(err)
	}
	best := -1.0
	var records, nbytes int
	for i := 0; i < repeat; i++ {
		start := time.Now()
		r, n, _, err := pass(path, batch, prefetch)
		elapsed := time.Since(start).Seconds()
		if err != nil {
			log.Fatal(err)
		}
		records, nbytes = r, n
		if best < 0 || elapsed < best {
			best = elapsed
		}
	}
	out, _ := json.Marshal(map[string]any{"seconds": best, "records": records, "bytes": nbytes})
	fmt.Println(string(out))
}
