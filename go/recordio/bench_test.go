package recordio

import (
	"math/rand"
	"path/filepath"
	"testing"
)

// benchRead times reading a file of 32 MiB of 1 KiB records (half random, half
// zeros, as bench/recordio.py writes them) with the given compressor.
func benchRead(b *testing.B, c Compressor) {
	rng := rand.New(rand.NewSource(0))
	recs := make([][]byte, 32<<10)
	for i := range recs {
		r := make([]byte, 1024)
		rng.Read(r[:512])
		recs[i] = r
	}
	path := filepath.Join(b.TempDir(), "bench.recordio")
	if err := WriteFile(path, c, recs); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(recs)) * 1024)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r, err := Open(path)
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for r.Next() {
			n++
		}
		if err := r.Err(); err != nil || n != len(recs) {
			b.Fatalf("read %d records: %v", n, err)
		}
		r.Close()
	}
}

func BenchmarkReadNone(b *testing.B)   { benchRead(b, None) }
func BenchmarkReadSnappy(b *testing.B) { benchRead(b, Snappy) }
func BenchmarkReadGzip(b *testing.B)   { benchRead(b, Gzip) }
