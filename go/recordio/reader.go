package recordio

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Reader reads the records of a RecordIO stream in order, Scanner-style:
//
//	r, err := recordio.Open("train-00000.recordio")
//	...
//	defer r.Close()
//	for r.Next() {
//		use(r.Record())
//	}
//	if err := r.Err(); err != nil { ... }
//
// Every chunk is checked (magic, CRC-32 of the payload, compressor, record
// lengths) before any of its records is returned. A Reader is not safe for
// concurrent use.
type Reader struct {
	r     io.Reader
	f     *os.File
	name  string
	size  int64 // file size, or -1 for a stream
	chunk int   // index of the next chunk
	off   int64 // offset of the next chunk

	buf     []byte
	payload []byte
	records [][]byte
	pos     int
	cur     []byte
	err     error
	done    bool
	gz      *gzip.Reader
	limit   int64 // the most a compressed chunk may decode to
}

// ReaderOption configures a Reader (Open, NewReader).
type ReaderOption func(*Reader)

// WithMaxDecodedBytes sets the most one compressed chunk may decompress to
// (default MaxDecodedBytes, or the PYBRIDGE_RECORDIO_MAX_DECODED environment
// variable). A chunk that would decode to more is a *CorruptError.
func WithMaxDecodedBytes(n int64) ReaderOption { return func(r *Reader) { r.limit = n } }

// NewReader reads chunks from r; name appears in error messages.
func NewReader(r io.Reader, name string, opts ...ReaderOption) *Reader {
	rd := &Reader{r: r, name: name, size: -1}
	rd.configure(opts)
	return rd
}

// Open opens the file at path for reading. A missing or unreadable file gives
// an error wrapping the *os.PathError (errors.Is(err, fs.ErrNotExist) works).
func Open(path string, opts ...ReaderOption) (*Reader, error) {
	f, size, err := openRegular(path)
	if err != nil {
		return nil, err
	}
	r := &Reader{r: f, f: f, name: path, size: size}
	r.configure(opts)
	return r, nil
}

// configure applies the options over the default cap; a bad cap (from an
// option or the environment) becomes the Reader's error, so reading stops at once.
func (r *Reader) configure(opts []ReaderOption) {
	r.limit = MaxDecodedBytes
	if v := strings.TrimSpace(os.Getenv(MaxDecodedEnv)); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			r.err, r.done = fmt.Errorf("recordio: environment variable %s=%q is not a byte count of at least 1", MaxDecodedEnv, v), true
			return
		}
		r.limit = n
	}
	for _, o := range opts {
		o(r)
	}
	if r.limit < 1 {
		r.err, r.done = fmt.Errorf("recordio: %s: the decoded chunk cap must be at least 1 byte, got %d", r.name, r.limit), true
	}
}

// ErrNotRegular is wrapped by the error for a path that is not a regular file.
var ErrNotRegular = errors.New("not a regular file")

// openRegular opens a regular file and returns its size. Anything else is
// refused: opening a FIFO would block until a writer comes (O_NONBLOCK makes
// the open return at once; it changes nothing for a regular file), and a
// device never ends.
func openRegular(path string) (*os.File, int64, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("recordio: cannot open: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("recordio: cannot stat: %w", err)
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, 0, fmt.Errorf("recordio: cannot read %s: %w (%v)", path, ErrNotRegular, st.Mode().Type())
	}
	return f, st.Size(), nil
}

// Next advances to the next record; it returns false at the end of the
// stream or on an error (see Err).
func (r *Reader) Next() bool {
	if r == nil || r.done {
		return false
	}
	for r.pos >= len(r.records) {
		if !r.readChunk() {
			r.done, r.cur = true, nil
			return false
		}
	}
	r.cur = r.records[r.pos]
	r.pos++
	return true
}

// Record returns the current record. The slice is valid until the chunk's
// records are used up (a later Next may reuse its memory): copy it to keep it.
func (r *Reader) Record() []byte { return r.cur }

// Err returns the error that ended the reading, or nil at a clean end.
func (r *Reader) Err() error {
	if r == nil {
		return errors.New("recordio: nil *Reader")
	}
	return r.err
}

// Close closes the file of a Reader from Open.
func (r *Reader) Close() error {
	if r == nil {
		return nil
	}
	r.done = true
	if r.f != nil {
		f := r.f
		r.f = nil
		return f.Close()
	}
	return nil
}

func (r *Reader) corrupt(format string, args ...any) bool {
	r.err = &CorruptError{Path: r.name, Chunk: r.chunk, Offset: r.off, Msg: fmt.Sprintf(format, args...)}
	return false
}

func (r *Reader) ioFail(err error) bool {
	r.err = fmt.Errorf("recordio: %s: chunk %d, byte offset %d: read failed: %w", r.name, r.chunk, r.off, err)
	return false
}

// readChunk reads, checks and decodes the next chunk; false at the end or on error.
func (r *Reader) readChunk() bool {
	var hdr [HeaderSize]byte
	n, err := io.ReadFull(r.r, hdr[:])
	if err == io.EOF {
		if r.size == 0 {
			return r.corrupt("file is empty: a RecordIO file holds at least one chunk")
		}
		return false // a clean end between chunks
	}
	if err == io.ErrUnexpectedEOF {
		return r.corrupt("truncated chunk header: %d of %d bytes", n, HeaderSize)
	}
	if err != nil {
		return r.ioFail(err)
	}
	h := decodeHeader(hdr[:])
	if h.Magic != Magic {
		return r.corrupt("wrong magic 0x%08x (expected 0x%08x): not a RecordIO chunk", h.Magic, uint32(Magic))
	}
	if !h.Compressor.valid() {
		return r.corrupt("unknown compressor %d (known: 0 none, 1 snappy, 2 gzip)", uint32(h.Compressor))
	}
	if r.size >= 0 && r.off+HeaderSize+int64(h.Size) > r.size {
		return r.corrupt("payload size %d is larger than the file: only %d bytes follow the header", h.Size, r.size-r.off-HeaderSize)
	}
	body, ok := r.readBody(int64(h.Size))
	if !ok {
		return false
	}
	if got := crc32.Checksum(body, crcTable); got != h.Checksum {
		return r.corrupt("checksum mismatch: the header says 0x%08x, the payload's CRC-32 is 0x%08x", h.Checksum, got)
	}
	payload, err := r.decompress(h.Compressor, body)
	if err != nil {
		return r.corrupt("%v", err)
	}
	r.records, err = parseRecords(payload, h.NumRecords, r.records[:0])
	if err != nil {
		r.records = r.records[:0]
		return r.corrupt("%v", err)
	}
	r.pos = 0
	r.chunk++
	r.off += HeaderSize + int64(h.Size)
	return true
}

// readBody reads a chunk's n payload bytes into r.buf. A file's size was
// checked against n already; a stream's was not, so a large payload of a
// stream is read as it arrives rather than allocated up front from the header.
func (r *Reader) readBody(n int64) ([]byte, bool) {
	if r.size < 0 && n > int64(cap(r.buf)) && n > streamPrealloc {
		buf := bytes.NewBuffer(r.buf[:0])
		got, err := io.CopyN(buf, r.r, n)
		r.buf = buf.Bytes()
		if err == io.EOF {
			return nil, r.corrupt("truncated chunk: read %d of %d payload bytes", got, n)
		}
		if err != nil {
			return nil, r.ioFail(err)
		}
		return r.buf[:n], true
	}
	if int64(cap(r.buf)) < n {
		r.buf = make([]byte, n)
	}
	body := r.buf[:n]
	if got, err := io.ReadFull(r.r, body); err != nil {
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return nil, r.corrupt("truncated chunk: read %d of %d payload bytes", got, n)
		}
		return nil, r.ioFail(err)
	}
	return body, true
}

// streamPrealloc is the largest payload of a stream (NewReader) allocated
// from its header alone; a larger one grows as its bytes arrive.
const streamPrealloc = 64 << 20

func (r *Reader) tooBig(what string) error {
	return fmt.Errorf("%s decodes to more than %d bytes, the most a chunk may decode to (WithMaxDecodedBytes / %s; default %d)",
		what, r.limit, MaxDecodedEnv, MaxDecodedBytes)
}

func (r *Reader) decompress(c Compressor, body []byte) ([]byte, error) {
	switch c {
	case None:
		// The records alias r.buf, which the next chunk overwrites: that is
		// after this chunk's records are used up, as Record documents.
		return body, nil
	case Snappy:
		p, err := snappyFrameDecode(r.payload[:0], body, r.limit)
		r.payload = p[:0]
		if errors.Is(err, errSnappyTooBig) {
			return nil, r.tooBig(err.Error())
		}
		return p, err
	case Gzip:
		var err error
		if r.gz == nil {
			r.gz, err = gzip.NewReader(bytes.NewReader(body))
		} else {
			err = r.gz.Reset(bytes.NewReader(body))
		}
		if err != nil {
			return nil, fmt.Errorf("gzip payload does not decode: %v", err)
		}
		// Inflate at most limit+1 bytes: one more than allowed tells a chunk
		// that is too big from one that is exactly at the cap.
		out := bytes.NewBuffer(r.payload[:0])
		n, err := io.Copy(out, io.LimitReader(r.gz, r.limit+1))
		p := out.Bytes()
		r.payload = p[:0]
		if err != nil {
			return nil, fmt.Errorf("gzip payload does not decode: %v", err)
		}
		if n > r.limit {
			return nil, r.tooBig("gzip payload")
		}
		return p, nil
	}
	return nil, fmt.Errorf("unknown compressor %d", uint32(c))
}

// ReadFile returns every record of the file at path (copies, independent of
// the reader's buffers).
func ReadFile(path string) ([][]byte, error) {
	r, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	var out [][]byte
	for r.Next() {
		out = append(out, bytes.Clone(r.Record()))
	}
	return out, r.Err()
}

// Chunk describes one chunk of a file, as Index finds it.
type Chunk struct {
	ChunkHeader
	Offset int64 // byte offset of the chunk's header
	First  int64 // index of the chunk's first record in the file
}

// Index scans the chunk headers of the file at path (payloads are skipped,
// not read or checked) and returns where each chunk and its records lie.
func Index(path string) ([]Chunk, error) {
	f, size, err := openRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if size == 0 {
		return nil, &CorruptError{Path: path, Msg: "file is empty: a RecordIO file holds at least one chunk"}
	}
	var chunks []Chunk
	var off, first int64
	var hdr [HeaderSize]byte
	for i := 0; off < size; i++ {
		bad := func(format string, args ...any) error {
			return &CorruptError{Path: path, Chunk: i, Offset: off, Msg: fmt.Sprintf(format, args...)}
		}
		n, err := f.ReadAt(hdr[:], off)
		if n < HeaderSize {
			if err != nil && err != io.EOF {
				return nil, fmt.Errorf("recordio: %s: chunk %d, byte offset %d: read failed: %w", path, i, off, err)
			}
			return nil, bad("truncated chunk header: %d of %d bytes", n, HeaderSize)
		}
		h := decodeHeader(hdr[:])
		switch {
		case h.Magic != Magic:
			return nil, bad("wrong magic 0x%08x (expected 0x%08x): not a RecordIO chunk", h.Magic, uint32(Magic))
		case !h.Compressor.valid():
			return nil, bad("unknown compressor %d (known: 0 none, 1 snappy, 2 gzip)", uint32(h.Compressor))
		case off+HeaderSize+int64(h.Size) > size:
			return nil, bad("payload size %d is larger than the file: only %d bytes follow the header", h.Size, size-off-HeaderSize)
		}
		chunks = append(chunks, Chunk{ChunkHeader: h, Offset: off, First: first})
		off += HeaderSize + int64(h.Size)
		first += int64(h.NumRecords)
	}
	return chunks, nil
}
