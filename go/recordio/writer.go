package recordio

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
)

// Writer writes records to a RecordIO stream. A chunk is closed when the next
// record would take its raw record bytes past the chunk limit (32 MiB by
// default), the rule of the Python writer and of wangkuiyi/recordio; empty
// chunks are never written. A Writer is not safe for concurrent use.
type Writer struct {
	w        io.Writer
	f        *os.File // set by Create: closed by Close
	name     string
	comp     Compressor
	maxChunk int

	payload []byte // the open chunk in payload layout
	raw     int    // record bytes in the open chunk
	count   int    // records in the open chunk
	scratch bytes.Buffer
	gz      *gzip.Writer

	offset  int64
	chunks  int
	records int64
	err     error // sticky: after a failed write the stream is unusable
	closed  bool
}

// WriterOption configures a Writer.
type WriterOption func(*Writer)

// WithMaxChunkBytes sets the raw record bytes at which a chunk is closed
// (1 .. MaxChunkLimit). A record larger than this is refused.
func WithMaxChunkBytes(n int) WriterOption { return func(w *Writer) { w.maxChunk = n } }

// WithName sets the name used in error messages (Create uses the path).
func WithName(name string) WriterOption { return func(w *Writer) { w.name = name } }

// NewWriter writes chunks compressed with c to w. Close writes the last
// chunk; it does not close w.
func NewWriter(w io.Writer, c Compressor, opts ...WriterOption) (*Writer, error) {
	wr := &Writer{w: w, name: "<stream>", comp: c, maxChunk: DefaultMaxChunkBytes}
	for _, o := range opts {
		if o != nil {
			o(wr)
		}
	}
	if w == nil {
		return nil, errors.New("recordio: NewWriter: nil io.Writer")
	}
	if !c.valid() {
		return nil, fmt.Errorf("recordio: unknown compressor %d; choose None, Snappy or Gzip", uint32(c))
	}
	if wr.maxChunk < 1 || wr.maxChunk > MaxChunkLimit {
		return nil, fmt.Errorf("recordio: max chunk bytes must be in 1..%d, got %d", MaxChunkLimit, wr.maxChunk)
	}
	return wr, nil
}

// Create creates (or truncates) the file at path and returns a Writer to it.
func Create(path string, c Compressor, opts ...WriterOption) (*Writer, error) {
	opts = append([]WriterOption{WithName(path)}, opts...)
	if _, err := NewWriter(io.Discard, c, opts...); err != nil { // check options before creating the file
		return nil, err
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("recordio: cannot create: %w", err)
	}
	w, _ := NewWriter(f, c, opts...)
	w.f = f
	return w, nil
}

// Write appends one record. The bytes are copied; rec may be reused after.
func (w *Writer) Write(rec []byte) error {
	if err := w.check(); err != nil {
		return err
	}
	n := len(rec)
	if n > w.maxChunk {
		return fmt.Errorf("recordio: %s: record of %d bytes is larger than the chunk limit of %d bytes", w.name, n, w.maxChunk)
	}
	if w.count > 0 && w.raw+n > w.maxChunk {
		if err := w.Flush(); err != nil {
			return err
		}
	}
	w.payload = binary.LittleEndian.AppendUint32(w.payload, uint32(n))
	w.payload = append(w.payload, rec...)
	w.raw += n
	w.count++
	w.records++
	return nil
}

// Flush closes the open chunk, if it holds records, and writes it out.
func (w *Writer) Flush() error {
	if err := w.check(); err != nil {
		return err
	}
	if w.count == 0 {
		return nil
	}
	body, err := w.compress()
	if err != nil {
		return w.fail(err)
	}
	if len(body) > math.MaxUint32 {
		return w.fail(fmt.Errorf("compressed chunk of %d bytes does not fit the 32-bit size field", len(body)))
	}
	h := ChunkHeader{Magic: Magic, Checksum: crc32.Checksum(body, crcTable), Compressor: w.comp,
		Size: uint32(len(body)), NumRecords: uint32(w.count)}
	var hdr [HeaderSize]byte
	h.encode(hdr[:])
	if _, err := w.w.Write(hdr[:]); err != nil {
		return w.fail(err)
	}
	if _, err := w.w.Write(body); err != nil {
		return w.fail(err)
	}
	w.offset += int64(HeaderSize + len(body))
	w.chunks++
	w.payload, w.raw, w.count = w.payload[:0], 0, 0
	return nil
}

func (w *Writer) compress() ([]byte, error) {
	switch w.comp {
	case Snappy:
		w.scratch.Reset()
		b := snappyFrameEncode(w.scratch.Bytes(), w.payload)
		return b, nil
	case Gzip:
		w.scratch.Reset()
		if w.gz == nil {
			w.gz = gzip.NewWriter(&w.scratch)
		} else {
			w.gz.Reset(&w.scratch)
		}
		if _, err := w.gz.Write(w.payload); err != nil {
			return nil, err
		}
		if err := w.gz.Close(); err != nil {
			return nil, err
		}
		return w.scratch.Bytes(), nil
	}
	return w.payload, nil
}

func (w *Writer) fail(err error) error {
	w.err = fmt.Errorf("recordio: %s: chunk %d, byte offset %d: write failed: %w", w.name, w.chunks, w.offset, err)
	return w.err
}

func (w *Writer) check() error {
	if w == nil {
		return errors.New("recordio: nil *Writer")
	}
	if w.closed {
		return fmt.Errorf("recordio: %s: writer is closed", w.name)
	}
	return w.err
}

// Close writes the last chunk and, for a Writer from Create, closes the file.
// Closing again returns nil.
func (w *Writer) Close() error {
	if w == nil {
		return errors.New("recordio: nil *Writer")
	}
	if w.closed {
		return nil
	}
	err := w.Flush()
	w.closed = true
	if w.f != nil {
		if cerr := w.f.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("recordio: %s: close failed: %w", w.name, cerr)
		}
	}
	return err
}

// Records returns the number of records written so far.
func (w *Writer) Records() int64 { return w.records }

// Chunks returns the number of chunks written so far.
func (w *Writer) Chunks() int { return w.chunks }

// WriteFile writes records to a new file at path.
func WriteFile(path string, c Compressor, records [][]byte, opts ...WriterOption) error {
	w, err := Create(path, c, opts...)
	if err != nil {
		return err
	}
	for _, r := range records {
		if err := w.Write(r); err != nil {
			w.Close()
			return err
		}
	}
	return w.Close()
}
