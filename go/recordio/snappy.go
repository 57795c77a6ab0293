package recordio

// The Snappy framing format (https://github.com/google/snappy/blob/main/framing_format.txt)
// and the raw Snappy block format it carries, implemented here because the
// standard library has neither.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/bits"
	"slices"
)

const (
	snappyMaxBlock   = 65536 // uncompressed bytes per frame
	frameCompressed  = 0x00
	frameRaw         = 0x01
	framePadding     = 0xfe
	frameStreamIdent = 0xff
)

var (
	snappyStreamID = []byte("\xff\x06\x00\x00sNaPpY")
	crc32cTable    = crc32.MakeTable(crc32.Castagnoli)
)

// snappyMask is the framing format's masked CRC-32C of uncompressed data.
func snappyMask(data []byte) uint32 {
	c := crc32.Checksum(data, crc32cTable)
	return bits.RotateLeft32(c, -15) + 0xa282ead8
}

// snappyFrameEncode appends src as a Snappy framing-format stream to dst: the
// stream identifier, then one frame per 64 KiB block, compressed unless that
// saves less than 1/8 (the rule of Go's github.com/golang/snappy writer).
func snappyFrameEncode(dst, src []byte) []byte {
	dst = append(dst, snappyStreamID...)
	var block []byte
	for len(src) > 0 {
		n := min(len(src), snappyMaxBlock)
		u := src[:n]
		src = src[n:]
		block = snappyEncodeBlock(block[:0], u)
		kind, body := byte(frameCompressed), block
		if len(block) >= len(u)-len(u)/8 {
			kind, body = frameRaw, u
		}
		length := 4 + len(body)
		dst = append(dst, kind, byte(length), byte(length>>8), byte(length>>16))
		dst = binary.LittleEndian.AppendUint32(dst, snappyMask(u))
		dst = append(dst, body...)
	}
	return dst
}

// errSnappyTooBig is wrapped by snappyFrameDecode's error for a stream that
// would decode to more than its limit.
var errSnappyTooBig = errors.New("snappy stream")

// snappyFrameDecode decodes a whole framing-format stream, appending to dst.
// Each frame's size is checked before it is decoded: at most 65536 bytes (the
// framing format's limit), and at most limit bytes for the whole stream (an
// error wrapping errSnappyTooBig), so a crafted stream cannot make it allocate
// more than limit.
func snappyFrameDecode(dst, src []byte, limit int64) ([]byte, error) {
	if len(src) == 0 {
		return dst, nil // an empty stream
	}
	seenID := false
	base := len(dst)
	for pos := 0; pos < len(src); {
		if pos+4 > len(src) {
			return dst, fmt.Errorf("snappy stream: frame header at byte %d is truncated", pos)
		}
		kind := src[pos]
		length := int(src[pos+1]) | int(src[pos+2])<<8 | int(src[pos+3])<<16
		body := pos + 4
		if body+length > len(src) {
			return dst, fmt.Errorf("snappy stream: frame at byte %d of %d bytes runs past the end of the %d-byte stream", pos, length, len(src))
		}
		frame := src[body : body+length]
		pos = body + length
		if kind == frameStreamIdent {
			if string(frame) != "sNaPpY" {
				return dst, errors.New("snappy stream: bad stream identifier")
			}
			seenID = true
			continue
		}
		if !seenID {
			return dst, errors.New("snappy stream: missing stream identifier")
		}
		switch {
		case kind == frameCompressed || kind == frameRaw:
			if len(frame) < 4 {
				return dst, fmt.Errorf("snappy stream: frame at byte %d is too short for its checksum", pos-length-4)
			}
			want := binary.LittleEndian.Uint32(frame)
			start := len(dst)
			size := uint64(len(frame) - 4)
			if kind == frameCompressed {
				n, k := binary.Uvarint(frame[4:])
				if k <= 0 {
					return dst, errSnappyBlock
				}
				size = n
			}
			if size > snappyMaxBlock {
				return dst, fmt.Errorf("snappy stream: the frame at byte %d declares %d bytes, more than the framing format's %d", pos-length-4, size, snappyMaxBlock)
			}
			if total := uint64(start-base) + size; total > uint64(limit) {
				return dst, fmt.Errorf("%w (the frame at byte %d reaches %d bytes)", errSnappyTooBig, pos-length-4, total)
			}
			if kind == frameRaw {
				dst = append(dst, frame[4:]...)
			} else {
				var err error
				if dst, err = snappyDecodeBlock(dst, frame[4:]); err != nil {
					return dst, err
				}
			}
			if len(dst)-start > snappyMaxBlock {
				return dst, fmt.Errorf("snappy stream: a frame decodes to %d bytes, more than %d", len(dst)-start, snappyMaxBlock)
			}
			if got := snappyMask(dst[start:]); got != want {
				return dst, fmt.Errorf("snappy stream: frame checksum mismatch (CRC-32C 0x%08x, the frame says 0x%08x)", got, want)
			}
		case kind >= 0x80: // skippable, padding included
		default:
			return dst, fmt.Errorf("snappy stream: reserved unskippable frame type 0x%02x", kind)
		}
	}
	return dst, nil
}

var errSnappyBlock = errors.New("snappy stream: corrupt compressed block")

// snappyDecodeBlock appends the decoding of one raw Snappy block to dst.
func snappyDecodeBlock(dst, src []byte) ([]byte, error) {
	n, k := binary.Uvarint(src)
	if k <= 0 || n > snappyMaxBlock {
		return dst, errSnappyBlock
	}
	base := len(dst)
	want := base + int(n)
	dst = slices.Grow(dst, int(n)) // amortized: exact growth per frame would copy the stream once per frame
	s := k
	for s < len(src) {
		tag := src[s]
		var length, offset int
		switch tag & 3 {
		case 0: // literal
			length = int(tag >> 2)
			s++
			if length >= 60 {
				extra := length - 59
				if s+extra > len(src) {
					return dst, errSnappyBlock
				}
				length = 0
				for i := 0; i < extra; i++ {
					length |= int(src[s+i]) << (8 * i)
				}
				s += extra
			}
			length++
			if s+length > len(src) || len(dst)+length > want {
				return dst, errSnappyBlock
			}
			dst = append(dst, src[s:s+length]...)
			s += length
			continue
		case 1:
			if s+2 > len(src) {
				return dst, errSnappyBlock
			}
			length = 4 + int(tag>>2)&7
			offset = int(tag&0xe0)<<3 | int(src[s+1])
			s += 2
		case 2:
			if s+3 > len(src) {
				return dst, errSnappyBlock
			}
			length = 1 + int(tag>>2)
			offset = int(binary.LittleEndian.Uint16(src[s+1:]))
			s += 3
		case 3:
			if s+5 > len(src) {
				return dst, errSnappyBlock
			}
			length = 1 + int(tag>>2)
			offset = int(binary.LittleEndian.Uint32(src[s+1:]))
			s += 5
		}
		d := len(dst) - base
		if offset <= 0 || offset > d || len(dst)+length > want {
			return dst, errSnappyBlock
		}
		from := len(dst) - offset
		for i := 0; i < length; i++ { // byte by byte: the copy may overlap its output
			dst = append(dst, dst[from+i])
		}
	}
	if len(dst) != want {
		return dst, errSnappyBlock
	}
	return dst, nil
}

// snappyEncodeBlock appends a raw Snappy block encoding src (at most 64 KiB)
// to dst: a greedy matcher over a hash table of 4-byte sequences.
func snappyEncodeBlock(dst, src []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(src)))
	if len(src) == 0 {
		return dst
	}
	if len(src) < 16 {
		return emitLiteral(dst, src)
	}
	const tableBits = 14
	var table [1 << tableBits]uint16 // position + 1; 0 means empty
	hash := func(u uint32) uint32 { return (u * 0x1e35a7bd) >> (32 - tableBits) }
	lit := 0 // start of the pending literal
	s := 0
	limit := len(src) - 4
	for s <= limit {
		u := binary.LittleEndian.Uint32(src[s:])
		h := hash(u)
		cand := int(table[h]) - 1
		table[h] = uint16(s + 1)
		if cand < 0 || binary.LittleEndian.Uint32(src[cand:]) != u {
			s++
			continue
		}
		if lit < s {
			dst = emitLiteral(dst, src[lit:s])
		}
		n := 4
		for s+n < len(src) && src[cand+n] == src[s+n] {
			n++
		}
		dst = emitCopy(dst, s-cand, n)
		s += n
		lit = s
	}
	if lit < len(src) {
		dst = emitLiteral(dst, src[lit:])
	}
	return dst
}

func emitLiteral(dst, lit []byte) []byte {
	n := len(lit) - 1
	switch {
	case n < 60:
		dst = append(dst, byte(n)<<2)
	case n < 1<<8:
		dst = append(dst, 60<<2, byte(n))
	case n < 1<<16:
		dst = append(dst, 61<<2, byte(n), byte(n>>8))
	default:
		dst = append(dst, 62<<2, byte(n), byte(n>>8), byte(n>>16))
	}
	return append(dst, lit...)
}

// emitCopy emits copies with 2-byte offsets (blocks are at most 64 KiB), each
// of at most 64 bytes.
func emitCopy(dst []byte, offset, length int) []byte {
	for length > 0 {
		n := min(length, 64)
		dst = append(dst, byte(n-1)<<2|2, byte(offset), byte(offset>>8))
		length -= n
	}
	return dst
}
