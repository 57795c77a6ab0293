package pybridge_test

import (
	"fmt"
	"log"
	"os"
	"path/filepath"

	pybridge "github.com/pybridge/pybridge/go"
	"github.com/pybridge/pybridge/go/recordio"
)

// Read RecordIO shards in batches, Scanner-style. With a group, each rank gets its
// own share of the records; a nil group reads everything in one process.
func ExampleOpenLoader() {
	dir, err := os.MkdirTemp("", "loader-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "numbers.recordio")
	var records [][]byte
	for i := 0; i < 5; i++ {
		records = append(records, []byte{byte(i)})
	}
	if err := recordio.WriteFile(path, recordio.None, records); err != nil {
		log.Fatal(err)
	}

	l, err := pybridge.OpenLoader(nil, []string{path}, 2)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	for l.Next() {
		b := l.Batch()
		for i := 0; i < b.Len(); i++ {
			fmt.Print(b.Record(i)[0], " ")
		}
		fmt.Println("|")
	}
	if err := l.Err(); err != nil {
		log.Fatal(err)
	}
	// Output:
	// 0 1 |
	// 2 3 |
	// 4 |
}
