package recordio

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

var repoRoot = func() string { p, _ := filepath.Abs("../.."); return p }()

func goldenPath(name string) string {
	return filepath.Join(repoRoot, "tests", "data", "recordio", name+".recordio")
}

func bs(ss ...string) [][]byte {
	out := make([][]byte, len(ss))
	for i, s := range ss {
		out[i] = []byte(s)
	}
	return out
}

// The shared test vectors (tests/data/recordio/vectors.json, written by
// tests/recordio_spec.py): the format's limits and each golden file's records, the
// same ones the Python tests check pybridge.recordio against.
type vectors struct {
	Limits struct {
		Magic                uint32 `json:"magic"`
		HeaderSize           int    `json:"header_size"`
		DefaultMaxChunkBytes int    `json:"default_max_chunk_bytes"`
		SnappyMaxBlock       int    `json:"snappy_max_block"`
		MaxDecodedBytes      int64  `json:"max_decoded_bytes"`
	} `json:"limits"`
	Records map[string][]string `json:"records"` // hex
	Corrupt map[string]string   `json:"corrupt"` // hex of crafted files every reader refuses
}

var shared = func() vectors {
	var v vectors
	data, err := os.ReadFile(filepath.Join(repoRoot, "tests", "data", "recordio", "vectors.json"))
	if err == nil {
		err = json.Unmarshal(data, &v)
	}
	if err != nil {
		panic("reading the shared RecordIO test vectors: " + err.Error())
	}
	return v
}()

// The golden files' records, from the shared vectors.
var golden = func() map[string][][]byte {
	out := map[string][][]byte{}
	for name, hexes := range shared.Records {
		for _, h := range hexes {
			r, err := hex.DecodeString(h)
			if err != nil {
				panic("vectors.json: " + err.Error())
			}
			out[name] = append(out[name], r)
		}
	}
	return out
}()

func TestConstantsAreTheSharedLimits(t *testing.T) {
	l := shared.Limits
	if Magic != l.Magic || HeaderSize != l.HeaderSize || DefaultMaxChunkBytes != l.DefaultMaxChunkBytes ||
		snappyMaxBlock != l.SnappyMaxBlock || MaxDecodedBytes != l.MaxDecodedBytes {
		t.Fatalf("Go's constants (magic %#x, header %d, chunk %d, snappy block %d, decoded cap %d) differ from vectors.json's %+v",
			Magic, HeaderSize, DefaultMaxChunkBytes, snappyMaxBlock, MaxDecodedBytes, l)
	}
	if len(golden) < 6 {
		t.Fatalf("vectors.json lists %d golden files, want at least 6", len(golden))
	}
}

func equalRecords(t *testing.T, got, want [][]byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d records, want %d", len(got), len(want))
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("record %d: got %d bytes %.40q, want %d bytes %.40q", i, len(got[i]), got[i], len(want[i]), want[i])
		}
	}
}

func TestGoldenFilesRead(t *testing.T) {
	for name, want := range golden {
		t.Run(name, func(t *testing.T) {
			got, err := ReadFile(goldenPath(name))
			if err != nil {
				t.Fatal(err)
			}
			equalRecords(t, got, want)
			chunks, err := Index(goldenPath(name))
			if err != nil {
				t.Fatal(err)
			}
			var n int64
			for _, c := range chunks {
				if c.First != n {
					t.Fatalf("chunk at %d: first record %d, want %d", c.Offset, c.First, n)
				}
				n += int64(c.NumRecords)
			}
			if n != int64(len(want)) {
				t.Fatalf("index counts %d records, want %d", n, len(want))
			}
		})
	}
}

// The Go writer reproduces the golden files that a deterministic writer must
// produce byte for byte (gzip output depends on the deflate implementation).
func TestGoldenFilesWrite(t *testing.T) {
	for _, c := range []struct {
		name string
		comp Compressor
		opts []WriterOption
	}{{"none", None, []WriterOption{WithMaxChunkBytes(8)}}, {"snappy", Snappy, nil}} {
		var buf bytes.Buffer
		w, err := NewWriter(&buf, c.comp, c.opts...)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range golden[c.name] {
			if err := w.Write(r); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(goldenPath(c.name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.Bytes(), want) {
			t.Errorf("%s: Go writer output differs from the golden file:\n got %x\nwant %x", c.name, buf.Bytes(), want)
		}
	}
}

// testRecords: sizes from 0 to 150 KB (several Snappy frames), half random, half zeros.
func testRecords(seed int64, n int) [][]byte {
	rng := rand.New(rand.NewSource(seed))
	sizes := []int{0, 1, 5, 100, 1000, 70000, 3, 150000}
	out := make([][]byte, n)
	for i := range out {
		r := make([]byte, sizes[i%len(sizes)])
		rng.Read(r[:len(r)/2])
		out[i] = r
	}
	return out
}

func TestRoundTrip(t *testing.T) {
	recs := testRecords(1, 40)
	for _, c := range []Compressor{None, Snappy, Gzip} {
		t.Run(c.String(), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "rt.recordio")
			if err := WriteFile(path, c, recs, WithMaxChunkBytes(300000)); err != nil {
				t.Fatal(err)
			}
			got, err := ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			equalRecords(t, got, recs)
			chunks, err := Index(path)
			if err != nil {
				t.Fatal(err)
			}
			if len(chunks) < 3 {
				t.Fatalf("expected several chunks, got %d", len(chunks))
			}
			for _, ch := range chunks {
				if ch.Compressor != c {
					t.Fatalf("chunk compressor %v, want %v", ch.Compressor, c)
				}
			}
		})
	}
}

func TestSnappyBlock(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	for _, n := range []int{0, 1, 15, 16, 17, 100, 4096, 65535, 65536} {
		for _, kind := range []string{"zeros", "random", "text", "mixed"} {
			src := make([]byte, n)
			switch kind {
			case "random":
				rng.Read(src)
			case "text":
				copy(src, strings.Repeat("the quick brown fox jumps over the lazy dog ", n/40+1))
			case "mixed":
				rng.Read(src[:n/3])
			}
			block := snappyEncodeBlock(nil, src)
			got, err := snappyDecodeBlock(nil, block)
			if err != nil || !bytes.Equal(got, src) {
				t.Fatalf("%s %d: round trip failed: %v", kind, n, err)
			}
			if kind == "zeros" && n >= 4096 && len(block) > n/10 {
				t.Fatalf("zeros %d: block of %d bytes, expected real compression", n, len(block))
			}
		}
	}
	// Corrupt blocks fail, never panic.
	block := snappyEncodeBlock(nil, bytes.Repeat([]byte("abcdefgh"), 1000))
	for i := range block {
		b := bytes.Clone(block)
		b[i] ^= 0xff
		snappyDecodeBlock(nil, b) //nolint:errcheck - only must not panic
		snappyDecodeBlock(nil, block[:i])
	}
}

// ---- interoperability with the Python core ----

const pyScript = `
import hashlib, json, sys
import numpy as np
from pybridge import recordio
mode, out = sys.argv[1], {}
for path, comp in zip(sys.argv[2::2], sys.argv[3::2]):
    if mode == "write":
        rng = np.random.default_rng(1)
        recs = []
        for i in range(40):
            n = [0, 1, 5, 100, 1000, 70000, 3, 150000][i % 8]
            a = np.zeros(n, np.uint8)
            a[:n // 2] = rng.integers(0, 256, n // 2)
            recs.append(a.tobytes())
        recordio.write_file(path, recs, compressor=comp, max_chunk_bytes=300000)
    else:
        with recordio.Reader(path) as r:
            r.verify()
            recs = list(r)
    out[path] = [[len(r), hashlib.sha256(r).hexdigest()] for r in recs]
print(json.dumps(out))
`

var (
	probeOnce sync.Once
	probeErr  string
)

func python(t *testing.T, args ...string) []byte {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not found")
	}
	env := append(os.Environ(), "PYTHONPATH="+repoRoot)
	probeOnce.Do(func() {
		probe := exec.Command(py, "-c", "import pybridge.recordio")
		probe.Env, probe.Dir = env, repoRoot
		if out, err := probe.CombinedOutput(); err != nil {
			probeErr = fmt.Sprintf("python3 cannot import pybridge.recordio: %v\n%s", err, out)
		}
	})
	if probeErr != "" {
		t.Skip(probeErr)
	}
	cmd := exec.Command(py, append([]string{"-c", pyScript}, args...)...)
	cmd.Env, cmd.Dir = env, repoRoot
	cmd.WaitDelay = 5 * time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python3 %v: %v\n%s", args, err, stderr.String())
	}
	return out
}

func digests(recs [][]byte) [][2]any {
	out := make([][2]any, len(recs))
	for i, r := range recs {
		sum := sha256.Sum256(r)
		out[i] = [2]any{float64(len(r)), hex.EncodeToString(sum[:])}
	}
	return out
}

func compareDigests(t *testing.T, got [][2]any, recs [][]byte) {
	t.Helper()
	want := digests(recs)
	if len(got) != len(want) {
		t.Fatalf("python saw %d records, Go %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("record %d: python %v, Go %v", i, got[i], want[i])
		}
	}
}

var compressors = []Compressor{None, Snappy, Gzip}

// pythonFiles runs the script once over one file per compressor (Python's
// start-up dominates) and returns the digests it printed per file.
func pythonFiles(t *testing.T, mode string, paths []string) map[string][][2]any {
	t.Helper()
	args := []string{mode}
	for i, p := range paths {
		args = append(args, p, compressors[i].String())
	}
	out := python(t, args...)
	var got map[string][][2]any
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("python output: %v\n%s", err, out)
	}
	return got
}

func TestGoWritesPythonReads(t *testing.T) {
	recs := testRecords(2, 40)
	dir := t.TempDir()
	var paths []string
	for _, c := range compressors {
		path := filepath.Join(dir, c.String()+".recordio")
		if err := WriteFile(path, c, recs, WithMaxChunkBytes(300000)); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, path)
	}
	got := pythonFiles(t, "read", paths)
	for i, c := range compressors {
		t.Run(c.String(), func(t *testing.T) { compareDigests(t, got[paths[i]], recs) })
	}
}

func TestPythonWritesGoReads(t *testing.T) {
	dir := t.TempDir()
	var paths []string
	for _, c := range compressors {
		paths = append(paths, filepath.Join(dir, c.String()+".recordio"))
	}
	got := pythonFiles(t, "write", paths)
	for i, c := range compressors {
		t.Run(c.String(), func(t *testing.T) {
			recs, err := ReadFile(paths[i])
			if err != nil {
				t.Fatal(err)
			}
			compareDigests(t, got[paths[i]], recs)
			chunks, err := Index(paths[i])
			if err != nil || len(chunks) < 3 || chunks[0].Compressor != c {
				t.Fatalf("index: %v chunks, err %v", len(chunks), err)
			}
		})
	}
}

// ---- bad input ----

func rawChunk(recs [][]byte) []byte {
	var payload []byte
	for _, r := range recs {
		payload = binary.LittleEndian.AppendUint32(payload, uint32(len(r)))
		payload = append(payload, r...)
	}
	return chunkWith(payload, None, uint32(len(recs)))
}

func chunkWith(payload []byte, c Compressor, n uint32) []byte {
	h := ChunkHeader{Magic: Magic, Checksum: crc32.ChecksumIEEE(payload), Compressor: c, Size: uint32(len(payload)), NumRecords: n}
	out := make([]byte, HeaderSize, HeaderSize+len(payload))
	h.encode(out)
	return append(out, payload...)
}

func TestBadInput(t *testing.T) {
	a := rawChunk(bs("first", "second"))
	b := rawChunk(bs("third"))
	off := int64(len(a)) // chunk 1's offset
	withB := func(edit func(b []byte) []byte) []byte {
		return append(bytes.Clone(a), edit(bytes.Clone(b))...)
	}
	cases := []struct {
		name  string
		data  []byte
		chunk int
		off   int64
		words string
	}{
		{"wrong magic", withB(func(b []byte) []byte { b[0] = 0x05; return b }), 1, off, "wrong magic"},
		{"checksum mismatch", withB(func(b []byte) []byte { b[len(b)-1] ^= 1; return b }), 1, off, "checksum mismatch"},
		{"truncated chunk", withB(func(b []byte) []byte { return b[:len(b)-2] }), 1, off, "larger than the file"},
		{"truncated header", withB(func(b []byte) []byte { return b[:7] }), 1, off, "truncated chunk header"},
		{"unknown compressor", withB(func(b []byte) []byte { b[8] = 9; return b }), 1, off, "unknown compressor 9"},
		{"record past chunk end", withB(func(b []byte) []byte {
			p := binary.LittleEndian.AppendUint32(nil, 100)
			return chunkWith(append(p, "abc"...), None, 1)
		}), 1, off, "runs past the end"},
		{"too many records", withB(func(b []byte) []byte { return chunkWith(b[HeaderSize:], None, 5) }), 1, off, "5 records"},
		{"bad snappy", withB(func(b []byte) []byte {
			return chunkWith([]byte("\xff\x06\x00\x00sNaPpY\x00\x05\x00\x00zzzzz"), Snappy, 1)
		}), 1, off, "snappy"},
		{"bad gzip", withB(func(b []byte) []byte { return chunkWith([]byte("\x1f\x8b\x08\x00garbage"), Gzip, 1) }), 1, off, "gzip"},
		{"empty file", nil, 0, 0, "file is empty"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "bad.recordio")
			if err := os.WriteFile(path, c.data, 0o644); err != nil {
				t.Fatal(err)
			}
			r, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			var got [][]byte
			for r.Next() {
				got = append(got, bytes.Clone(r.Record()))
			}
			err = r.Err()
			var ce *CorruptError
			if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) {
				t.Fatalf("want a *CorruptError, got %v", err)
			}
			if ce.Path != path || ce.Chunk != c.chunk || ce.Offset != c.off || !strings.Contains(err.Error(), c.words) {
				t.Fatalf("error %q: want chunk %d, offset %d, words %q", err, c.chunk, c.off, c.words)
			}
			msg := err.Error()
			if !strings.Contains(msg, path) || !strings.Contains(msg, "byte offset") {
				t.Fatalf("message does not name the file and offset: %s", msg)
			}
			// The good chunk before the bad one is returned, nothing of the bad one.
			if c.chunk == 1 {
				equalRecords(t, got, bs("first", "second"))
			} else if len(got) != 0 {
				t.Fatalf("records returned from a bad file: %q", got)
			}
			if c.name != "checksum mismatch" && !strings.HasPrefix(c.name, "bad ") && !strings.HasPrefix(c.name, "record") && c.name != "too many records" {
				if _, err := Index(path); !errors.Is(err, ErrCorrupt) {
					t.Fatalf("Index: want ErrCorrupt, got %v", err)
				}
			}
		})
	}
}

func TestMissingFileAndWriterErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope.recordio")
	if _, err := Open(missing); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Fatalf("Open of a missing file: %v", err)
	}
	if _, err := ReadFile(missing); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("ReadFile of a missing file: %v", err)
	}
	w, err := NewWriter(&bytes.Buffer{}, None, WithMaxChunkBytes(4), WithName("x.recordio"))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write([]byte("12345")); err == nil || !strings.Contains(err.Error(), "larger than the chunk limit") {
		t.Fatalf("oversized record: %v", err)
	}
	if _, err := NewWriter(&bytes.Buffer{}, Compressor(7)); err == nil {
		t.Fatal("unknown compressor accepted")
	}
	if _, err := NewWriter(&bytes.Buffer{}, None, WithMaxChunkBytes(0)); err == nil {
		t.Fatal("chunk limit 0 accepted")
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Write([]byte("a")); err == nil {
		t.Fatal("write after close accepted")
	}
	if c, err := ParseCompressor(" Snappy"); err != nil || c != Snappy {
		t.Fatalf("ParseCompressor: %v %v", c, err)
	}
}
