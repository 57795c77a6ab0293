// Package recordio reads and writes RecordIO files in pure Go, byte-compatible
// with pybridge's Python core (pybridge.recordio) and with the Go library
// GoTorch used (github.com/wangkuiyi/recordio). It needs neither cgo nor the
// pybridge C library: use it to produce training data from Go, or to read it
// without Python. The sharded, prefetching training loader is
// pybridge.OpenLoader in the parent package.
//
// # Format
//
// A file is a sequence of chunks, with no file header or footer. Each chunk is
// a 20-byte header of five little-endian uint32 values (magic 0x01020304,
// CRC-32 IEEE of the compressed payload, compressor 0 none / 1 Snappy framing
// format / 2 gzip, compressed payload size, number of records) followed by the
// compressed payload. Before compression the payload is, for each record, its
// uint32 little-endian length and then its bytes.
//
// # Errors
//
// A malformed file gives a *CorruptError naming the file, the chunk index and
// the chunk's byte offset; errors.Is(err, ErrCorrupt) matches it. No record of
// a chunk that fails a check is ever returned. So does a chunk that would
// decompress to more than the Reader's cap (MaxDecodedBytes by default), or a
// Snappy frame larger than 65536 bytes: both are refused before the memory is
// allocated.
package recordio

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
)

// Compressor says how a chunk's payload is compressed.
type Compressor uint32

// The compressors of the format.
const (
	None   Compressor = 0 // stored as is
	Snappy Compressor = 1 // Snappy framing (stream) format, not raw blocks
	Gzip   Compressor = 2 // gzip (RFC 1952)
)

func (c Compressor) String() string {
	switch c {
	case None:
		return "none"
	case Snappy:
		return "snappy"
	case Gzip:
		return "gzip"
	}
	return fmt.Sprintf("Compressor(%d)", uint32(c))
}

func (c Compressor) valid() bool { return c <= Gzip }

// ParseCompressor accepts "none", "snappy" or "gzip" (any case).
func ParseCompressor(name string) (Compressor, error) {
	switch strings.ToLower(strings.TrimSpace(name)) {
	case "none":
		return None, nil
	case "snappy":
		return Snappy, nil
	case "gzip":
		return Gzip, nil
	}
	return 0, fmt.Errorf("recordio: unknown compressor %q; choose none, snappy or gzip", name)
}

const (
	// Magic starts every chunk header.
	Magic = 0x01020304
	// HeaderSize is the size of a chunk header in bytes.
	HeaderSize = 20
	// DefaultMaxChunkBytes is the raw record bytes at which a writer closes a chunk.
	DefaultMaxChunkBytes = 32 << 20
	// MaxChunkLimit is the largest chunk size limit a Writer accepts.
	MaxChunkLimit = 1 << 31
	// MaxDecodedBytes is the default for the most a compressed chunk may
	// decompress to (length prefixes included), as in pybridge.recordio: the
	// format has no uncompressed size, so this bounds what a crafted chunk can
	// make a Reader allocate. A chunk that would decode to more is a
	// *CorruptError, found before that memory is allocated. Files written with
	// a chunk limit up to 128 MiB read under it; see WithMaxDecodedBytes and
	// MaxDecodedEnv to raise it.
	MaxDecodedBytes = 256 << 20
	// MaxDecodedEnv, when set to a byte count, replaces MaxDecodedBytes as the
	// default cap (the Python reader reads the same variable).
	MaxDecodedEnv = "PYBRIDGE_RECORDIO_MAX_DECODED"
)

// ChunkHeader is a decoded chunk header.
type ChunkHeader struct {
	Magic      uint32
	Checksum   uint32 // CRC-32 (IEEE) of the compressed payload
	Compressor Compressor
	Size       uint32 // compressed payload bytes
	NumRecords uint32
}

func (h *ChunkHeader) encode(b []byte) {
	binary.LittleEndian.PutUint32(b[0:], h.Magic)
	binary.LittleEndian.PutUint32(b[4:], h.Checksum)
	binary.LittleEndian.PutUint32(b[8:], uint32(h.Compressor))
	binary.LittleEndian.PutUint32(b[12:], h.Size)
	binary.LittleEndian.PutUint32(b[16:], h.NumRecords)
}

func decodeHeader(b []byte) ChunkHeader {
	return ChunkHeader{
		Magic:      binary.LittleEndian.Uint32(b[0:]),
		Checksum:   binary.LittleEndian.Uint32(b[4:]),
		Compressor: Compressor(binary.LittleEndian.Uint32(b[8:])),
		Size:       binary.LittleEndian.Uint32(b[12:]),
		NumRecords: binary.LittleEndian.Uint32(b[16:]),
	}
}

// ErrCorrupt matches every *CorruptError with errors.Is.
var ErrCorrupt = errors.New("recordio: corrupt data")

// CorruptError is data that failed a format or checksum check.
type CorruptError struct {
	Path   string // the file (or the name given to NewReader)
	Chunk  int    // index of the chunk in the file, from 0
	Offset int64  // byte offset of the chunk's header in the file
	Msg    string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("recordio: %s: chunk %d, byte offset %d: %s", e.Path, e.Chunk, e.Offset, e.Msg)
}

// Is makes errors.Is(err, ErrCorrupt) hold.
func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }

var crcTable = crc32.IEEETable

// parseRecords splits a decoded payload into its n records (sub-slices of
// payload), checking every length against the payload's end.
func parseRecords(payload []byte, n uint32, out [][]byte) ([][]byte, error) {
	size := len(payload)
	if n == 0 {
		if size != 0 {
			return out, fmt.Errorf("header says 0 records but the payload holds %d bytes", size)
		}
		return out, nil
	}
	if uint64(n)*4 > uint64(size) {
		return out, fmt.Errorf("the header says %d records, but a %d-byte payload holds at most %d", n, size, size/4)
	}
	pos := 0
	for i := 0; i < int(n); i++ {
		if pos+4 > size {
			return out, fmt.Errorf("record %d: length prefix at payload byte %d runs past the end of the %d-byte payload (header says %d records)", i, pos, size, n)
		}
		length := uint64(binary.LittleEndian.Uint32(payload[pos:]))
		pos += 4
		if uint64(pos)+length > uint64(size) {
			return out, fmt.Errorf("record %d: length %d at payload byte %d runs past the end of the %d-byte payload", i, length, pos-4, size)
		}
		end := pos + int(length)
		out = append(out, payload[pos:end:end])
		pos = end
	}
	if pos != size {
		return out, fmt.Errorf("%d bytes follow the last of the %d records in the payload", size-pos, n)
	}
	return out, nil
}
