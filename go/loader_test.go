package pybridge_test

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	pybridge "github.com/pybridge/pybridge/go"
	"github.com/pybridge/pybridge/go/recordio"
)

func init() { roles["loader"] = roleLoader }

// writeDataset writes nfiles files of per records each, "f<file>-r<record>",
// one compressor per file in turn, in chunks of a few records.
func writeDataset(t testing.TB, dir string, nfiles, per int) ([]string, []string) {
	t.Helper()
	comps := []recordio.Compressor{recordio.None, recordio.Snappy, recordio.Gzip}
	var files, all []string
	for f := 0; f < nfiles; f++ {
		path := filepath.Join(dir, fmt.Sprintf("part-%02d.recordio", f))
		var recs [][]byte
		for r := 0; r < per; r++ {
			s := fmt.Sprintf("f%d-r%d", f, r)
			recs = append(recs, []byte(s))
			all = append(all, s)
		}
		if err := recordio.WriteFile(path, comps[f%3], recs, recordio.WithMaxChunkBytes(20)); err != nil {
			t.Fatal(err)
		}
		files = append(files, path)
	}
	return files, all
}

// readPass reads one pass, checking the batch layout, and returns the records.
func readPass(l *pybridge.Loader, batchSize int) ([]string, int, error) {
	var out []string
	batches := 0
	for l.Next() {
		b := l.Batch()
		offs := b.Offsets()
		if b.Len() < 1 || b.Len() > batchSize || len(offs) != b.Len()+1 || offs[0] != 0 || int(offs[b.Len()]) != len(b.Data()) {
			return nil, 0, fmt.Errorf("bad batch layout: len %d, offsets %v, %d data bytes", b.Len(), offs, len(b.Data()))
		}
		for i := 0; i < b.Len(); i++ {
			out = append(out, string(b.Record(i)))
		}
		batches++
	}
	return out, batches, l.Err()
}

func TestLoaderSingleProcess(t *testing.T) {
	files, all := writeDataset(t, t.TempDir(), 3, 25)
	l, err := pybridge.OpenLoader(nil, files, 7)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if n := l.NumRecords(); n != 75 {
		t.Fatalf("NumRecords %d, want 75", n)
	}
	nb, err := l.NumBatches()
	if err != nil || nb != 11 {
		t.Fatalf("NumBatches %d (%v), want 11", nb, err)
	}
	got, batches, err := readPass(l, 7)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, all) || batches != nb {
		t.Fatalf("pass 1: %d batches, records %v", batches, got)
	}
	// The next pass starts after the end; a clone survives the following Next.
	if !l.Next() {
		t.Fatalf("second pass did not start: %v", l.Err())
	}
	kept := l.Batch().Clone()
	rest, _, err := readPass(l, 7)
	if err != nil || len(rest) != 75-7 || string(kept.Record(0)) != "f0-r0" || len(kept.Records()) != 7 {
		t.Fatalf("second pass: %d records, first %q, err %v", len(rest), kept.Record(0), err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if l.Next() || !errors.Is(l.Err(), pybridge.ErrClosed) {
		t.Fatalf("Next after Close: %v", l.Err())
	}
	if err := l.SetEpoch(1); !errors.Is(err, pybridge.ErrClosed) {
		t.Fatalf("SetEpoch after Close: %v", err)
	}
}

func TestLoaderShuffleEpochs(t *testing.T) {
	files, all := writeDataset(t, t.TempDir(), 2, 30)
	l, err := pybridge.OpenLoader(nil, files, 8, pybridge.WithShuffle(5), pybridge.WithDropLast())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var passes [][]string
	for _, epoch := range []int{0, 1, 0} {
		if err := l.SetEpoch(epoch); err != nil {
			t.Fatal(err)
		}
		got, batches, err := readPass(l, 8)
		if err != nil {
			t.Fatal(err)
		}
		if batches != 7 || len(got) != 56 {
			t.Fatalf("epoch %d: %d batches, %d records; want 7 full batches", epoch, batches, len(got))
		}
		passes = append(passes, got)
	}
	if !slices.Equal(passes[0], passes[2]) {
		t.Fatal("the same epoch gave different orders")
	}
	if slices.Equal(passes[0], passes[1]) || slices.Equal(passes[0], all[:56]) {
		t.Fatal("shuffle did not change the order")
	}
	for _, p := range passes {
		if len(dedup(p)) != len(p) {
			t.Fatal("a record was read twice in one pass")
		}
	}
}

func dedup(s []string) []string {
	c := slices.Clone(s)
	sort.Strings(c)
	return slices.Compact(c)
}

func TestLoaderErrors(t *testing.T) {
	dir := t.TempDir()
	files, _ := writeDataset(t, dir, 1, 10) // chunks of 2 records (20 bytes)
	missing := filepath.Join(dir, "missing.recordio")
	if _, err := pybridge.OpenLoader(nil, []string{files[0], missing}, 4); !errors.Is(err, pybridge.ErrIO) || !strings.Contains(err.Error(), missing) {
		t.Fatalf("missing file: %v", err)
	}
	if _, err := pybridge.OpenLoader(nil, nil, 4); !errors.Is(err, pybridge.ErrInvalidArgument) {
		t.Fatalf("no files: %v", err)
	}
	if _, err := pybridge.OpenLoader(nil, files, 0); !errors.Is(err, pybridge.ErrInvalidArgument) {
		t.Fatalf("batch size 0: %v", err)
	}
	if _, err := pybridge.OpenLoader(nil, files, 1, pybridge.WithPartition(7)); !errors.Is(err, pybridge.ErrInvalidArgument) {
		t.Fatalf("bad partition: %v", err)
	}
	chunks, err := recordio.Index(files[0])
	if err != nil || len(chunks) < 3 {
		t.Fatalf("index: %v, %d chunks", err, len(chunks))
	}
	data, _ := os.ReadFile(files[0])

	// A flipped payload byte in chunk 1: found when the chunk is read.
	bad := slices.Clone(data)
	bad[chunks[1].Offset+recordio.HeaderSize+5] ^= 0xff
	crcPath := filepath.Join(dir, "crc.recordio")
	os.WriteFile(crcPath, bad, 0o644)
	l, err := pybridge.OpenLoader(nil, []string{crcPath}, 4)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = readPass(l, 4)
	want := fmt.Sprintf("%s: chunk 1, byte offset %d", crcPath, chunks[1].Offset)
	if !errors.Is(err, pybridge.ErrCorrupt) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("checksum mismatch: %v (want %q)", err, want)
	}
	l.Close()

	// The same file with WithSkipCorrupt: the other chunks' records, one chunk counted.
	l, err = pybridge.OpenLoader(nil, []string{crcPath}, 4, pybridge.WithSkipCorrupt())
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := readPass(l, 4)
	n, cerr := l.CorruptChunks()
	if err != nil || cerr != nil || n != 1 || len(got) != 10-int(chunks[1].NumRecords) || slices.Contains(got, fmt.Sprintf("f0-r%d", chunks[1].First)) {
		t.Fatalf("skip corrupt: records %v, corrupt chunks %d, errors %v %v", got, n, err, cerr)
	}
	l.Close()

	// Wrong magic in chunk 2: found when the headers are scanned, at open.
	bad = slices.Clone(data)
	binary.LittleEndian.PutUint32(bad[chunks[2].Offset:], 0xdeadbeef)
	magicPath := filepath.Join(dir, "magic.recordio")
	os.WriteFile(magicPath, bad, 0o644)
	_, err = pybridge.OpenLoader(nil, []string{magicPath}, 4)
	want = fmt.Sprintf("%s: chunk 2, byte offset %d", magicPath, chunks[2].Offset)
	if !errors.Is(err, pybridge.ErrCorrupt) || !strings.Contains(err.Error(), want) {
		t.Fatalf("wrong magic: %v (want %q)", err, want)
	}
}

// Two ranks get disjoint shares that together cover the dataset, under the
// static and the dynamic partition.
func TestLoader2Ranks(t *testing.T) {
	dir := t.TempDir()
	_, all := writeDataset(t, dir, 3, 20)
	procs := runRanks(t, &launch{role: "loader", world: 2, limit: 120 * time.Second,
		env: []string{"PB_TEST_LOADER_DIR=" + dir}})
	expectPass(t, procs)
	shares := map[string][][]string{}
	for _, p := range procs {
		for _, line := range strings.Split(p.out.String(), "\n") {
			if rest, ok := strings.CutPrefix(line, "LOADER "); ok {
				var res struct {
					Mode    string
					Records []string
				}
				if err := json.Unmarshal([]byte(rest), &res); err != nil {
					t.Fatal(err)
				}
				shares[res.Mode] = append(shares[res.Mode], res.Records)
			}
		}
	}
	for _, mode := range []string{"static", "dynamic", "dynamic again"} {
		s := shares[mode]
		if len(s) != 2 {
			t.Fatalf("%s: got %d ranks' results", mode, len(s))
		}
		if mode == "static" && len(s[0]) != len(s[1]) {
			t.Fatalf("static: unequal shares %d and %d", len(s[0]), len(s[1]))
		}
		union := append(slices.Clone(s[0]), s[1]...)
		if len(dedup(union)) != len(union) {
			t.Fatalf("%s: shares overlap", mode)
		}
		if !slices.Equal(dedup(union), dedup(all)) {
			t.Fatalf("%s: shares do not cover the dataset: %d of %d records", mode, len(union), len(all))
		}
	}
}

func roleLoader() error {
	g, err := pybridge.Init(pybridge.WithBackend("gloo"), pybridge.WithTimeout(60*time.Second))
	if err != nil {
		return err
	}
	defer g.Close()
	files, err := filepath.Glob(filepath.Join(os.Getenv("PB_TEST_LOADER_DIR"), "part-*.recordio"))
	if err != nil || len(files) != 3 {
		return fmt.Errorf("dataset files: %v %v", files, err)
	}
	// The dynamic loader is opened twice over the same files, batch size and epoch: the
	// second must read its full share, not find the first one's claim counters used up.
	for pass, mode := range []pybridge.Partition{pybridge.StaticPartition, pybridge.DynamicPartition, pybridge.DynamicPartition} {
		opts := []pybridge.LoaderOption{pybridge.WithPartition(mode), pybridge.WithShuffle(3)}
		if mode == pybridge.StaticPartition {
			// 60 records, 2 ranks, batches of 5: nothing is dropped. (The dynamic
			// partition would drop each rank's final partial batch.)
			opts = append(opts, pybridge.WithDropLast())
		}
		l, err := pybridge.OpenLoader(g, files, 5, opts...)
		if err != nil {
			return err
		}
		if err := l.SetEpoch(2); err != nil {
			return err
		}
		recs, batches, err := readPass(l, 5)
		if err != nil {
			return err
		}
		nb, err := l.NumBatches()
		if err != nil {
			return err
		}
		name := []string{"static", "dynamic", "dynamic again"}[pass]
		if mode == pybridge.StaticPartition && (nb != 6 || batches != 6) {
			return fmt.Errorf("static: %d batches, NumBatches %d, want 6", batches, nb)
		}
		if mode == pybridge.DynamicPartition && nb != -1 {
			return fmt.Errorf("dynamic: NumBatches %d, want -1", nb)
		}
		out, _ := json.Marshal(map[string]any{"Mode": name, "Records": recs})
		fmt.Printf("LOADER %s\n", out)
		if err := l.Close(); err != nil {
			return err
		}
		if err := g.Barrier(); err != nil {
			return err
		}
	}
	return g.Close()
}

func TestLoaderPrefetchOption(t *testing.T) {
	files, all := writeDataset(t, t.TempDir(), 2, 20)
	for _, n := range []int{0, 1, 5} {
		l, err := pybridge.OpenLoader(nil, files, 6, pybridge.WithPrefetch(n))
		if err != nil {
			t.Fatalf("WithPrefetch(%d): %v", n, err)
		}
		got, _, err := readPass(l, 6)
		l.Close()
		if err != nil || !slices.Equal(got, all) {
			t.Fatalf("WithPrefetch(%d): %v, records %v", n, err, got)
		}
	}
	if _, err := pybridge.OpenLoader(nil, files, 6, pybridge.WithPrefetch(-1)); !errors.Is(err, pybridge.ErrInvalidArgument) {
		t.Fatalf("WithPrefetch(-1): %v", err)
	}
}
