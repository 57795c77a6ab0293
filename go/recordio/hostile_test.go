package recordio

// Crafted files with valid CRCs and hostile sizes (issue 32, finding 9): each
// is a *CorruptError naming the file, chunk 1 and its offset, after chunk 0's
// record, and none makes the reader allocate what it declares. The Python
// reader checks the same shared files (tests/test_recordio_hostile.py).

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

const mib = 1 << 20

var goodChunk = rawChunk(bs("ok")) // chunk 0 of every file here; the hostile one is chunk 1

// readHostile reads data (written to a file) and checks that it yields "ok",
// then a *CorruptError for chunk 1 whose message holds words. It returns the
// bytes the Go heap allocated meanwhile.
func readHostile(t *testing.T, data []byte, words string, opts ...ReaderOption) uint64 {
	t.Helper()
	path := filepath.Join(t.TempDir(), "hostile.recordio")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	r, err := Open(path, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var got [][]byte
	for r.Next() {
		got = append(got, bytes.Clone(r.Record()))
	}
	runtime.ReadMemStats(&after)
	equalRecords(t, got, bs("ok"))
	var ce *CorruptError
	if err := r.Err(); !errors.As(err, &ce) || ce.Path != path || ce.Chunk != 1 || ce.Offset != int64(len(goodChunk)) ||
		!strings.Contains(err.Error(), words) {
		t.Fatalf("want a *CorruptError for chunk 1 at byte %d saying %q, got %v", len(goodChunk), words, err)
	}
	return after.TotalAlloc - before.TotalAlloc
}

func TestHostileSharedFilesAreCorrupt(t *testing.T) {
	if len(shared.Corrupt) < 2 {
		t.Fatalf("vectors.json lists %d hostile files, want at least 2", len(shared.Corrupt))
	}
	for name, h := range shared.Corrupt {
		t.Run(name, func(t *testing.T) {
			data, err := hex.DecodeString(h)
			if err != nil {
				t.Fatal(err)
			}
			if alloc := readHostile(t, data, "65536"); alloc > 8*mib {
				t.Fatalf("reading it allocated %d bytes", alloc)
			}
		})
	}
}

func TestSnappyRawFrameOver65536IsRefused(t *testing.T) {
	frame := append([]byte{frameRaw, 0, 0, 0}, make([]byte, 4+65537)...) // refused before its CRC
	binary.LittleEndian.PutUint16(frame[1:], uint16((4+65537)&0xffff))
	frame[3] = byte((4 + 65537) >> 16)
	stream := append(bytes.Clone(snappyStreamID), frame...)
	readHostile(t, append(bytes.Clone(goodChunk), chunkWith(stream, Snappy, 1)...), "declares 65537 bytes")
}

// gzipZeros is a gzip stream (members members) of one record of n-4 zeros.
func gzipZeros(t *testing.T, n, members int) []byte {
	var out bytes.Buffer
	zeros := make([]byte, mib)
	left := n
	for m := 0; m < members; m++ {
		w, _ := gzip.NewWriterLevel(&out, gzip.BestCompression)
		part := left / (members - m)
		left -= part
		if m == 0 {
			w.Write(binary.LittleEndian.AppendUint32(nil, uint32(n-4)))
			part -= 4
		}
		for part > 0 {
			k := min(part, mib)
			w.Write(zeros[:k])
			part -= k
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return out.Bytes()
}

func TestGzipBombIsRefusedWithoutAllocatingIt(t *testing.T) {
	// One record of 64 MiB of zeros in a 64 KiB chunk, valid in every other
	// respect: read whole before; now refused after at most the cap, 8 MiB
	// here, given through the environment (as Python reads it) or an option.
	for _, members := range []int{1, 3} {
		payload := gzipZeros(t, 64*mib, members)
		if len(payload) > 128<<10 {
			t.Fatalf("the bomb is %d bytes", len(payload))
		}
		data := append(bytes.Clone(goodChunk), chunkWith(payload, Gzip, 1)...)
		t.Setenv(MaxDecodedEnv, strconv.Itoa(8*mib))
		if alloc := readHostile(t, data, "gzip payload decodes to more than 8388608 bytes"); alloc > 40*mib {
			t.Fatalf("%d members: reading the refused chunk allocated %d bytes", members, alloc)
		}
		os.Unsetenv(MaxDecodedEnv)
		readHostile(t, data, "more than 8388608", WithMaxDecodedBytes(8*mib))
		path := filepath.Join(t.TempDir(), "bomb.recordio")
		os.WriteFile(path, data, 0o644)
		r, _ := Open(path, WithMaxDecodedBytes(64*mib)) // a raised cap reads it
		n := 0
		for r.Next() {
			n++
		}
		if r.Err() != nil || n != 2 {
			t.Fatalf("with the cap raised: %d records, %v", n, r.Err())
		}
		r.Close()
	}
}

func TestChunkAtTheCapReadsOneByteMoreDoesNot(t *testing.T) {
	recs := [][]byte{bytes.Repeat([]byte("0123456789abcdef"), 5000), []byte("tail")}
	size := int64(8 + len(recs[0]) + len(recs[1]))
	for _, c := range []Compressor{Snappy, Gzip} {
		buf := bytes.NewBuffer(bytes.Clone(goodChunk))
		w, _ := NewWriter(buf, c)
		for _, rec := range recs {
			w.Write(rec)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		r := NewReader(bytes.NewReader(buf.Bytes()), "mem", WithMaxDecodedBytes(size))
		n := 0
		for r.Next() {
			n++
		}
		if r.Err() != nil || n != 3 {
			t.Fatalf("%v at the cap: %d records, %v", c, n, r.Err())
		}
		readHostile(t, buf.Bytes(), "decodes to more than "+strconv.FormatInt(size-1, 10), WithMaxDecodedBytes(size-1))
	}
}

func TestStreamHeaderDoesNotAllocateItsPayload(t *testing.T) {
	// A stream (NewReader) cannot be checked against a file size: a header
	// declaring a 4 GiB payload followed by 10 bytes was a 4 GiB allocation.
	h := ChunkHeader{Magic: Magic, Compressor: None, Size: 1<<32 - 1, NumRecords: 1}
	data := make([]byte, HeaderSize+10)
	h.encode(data)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	r := NewReader(bytes.NewReader(data), "stream")
	for r.Next() {
	}
	runtime.ReadMemStats(&after)
	if !errors.Is(r.Err(), ErrCorrupt) || !strings.Contains(r.Err().Error(), "truncated chunk: read 10 of 4294967295") {
		t.Fatalf("want a truncated chunk, got %v", r.Err())
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8*mib {
		t.Fatalf("reading it allocated %d bytes", alloc)
	}
}

func TestBadDecodedCapIsNamed(t *testing.T) {
	t.Setenv(MaxDecodedEnv, "lots")
	r := NewReader(bytes.NewReader(goodChunk), "mem")
	if r.Next() || r.Err() == nil || !strings.Contains(r.Err().Error(), MaxDecodedEnv) {
		t.Fatalf("a bad %s: %v", MaxDecodedEnv, r.Err())
	}
	os.Unsetenv(MaxDecodedEnv)
	r = NewReader(bytes.NewReader(goodChunk), "mem", WithMaxDecodedBytes(0))
	if r.Next() || r.Err() == nil || !strings.Contains(r.Err().Error(), "at least 1 byte") {
		t.Fatalf("cap 0: %v", r.Err())
	}
}
