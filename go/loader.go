package pybridge

/*
#include "pbgo_loader.h"
*/
import "C"

import (
	"context"
	"math"
	"unsafe"
)

// Partition says how the records are shared among ranks.
type Partition int

const (
	// StaticPartition gives every rank a fixed, disjoint share with the same
	// number of batches (torch's DistributedSampler semantics).
	StaticPartition Partition = C.PB_PARTITION_STATIC
	// DynamicPartition lets ranks claim the next task on demand through the
	// group's store: a faster rank reads more, every record is still read
	// exactly once per epoch. Every rank must read each pass to its end.
	// Each dynamic loader has claim counters of its own, so loaders over the
	// same data each read everything; every rank must open its dynamic
	// loaders in the same order.
	DynamicPartition Partition = C.PB_PARTITION_DYNAMIC
)

type loaderConfig struct {
	partition   Partition
	shuffle     bool
	seed        int64
	dropLast    bool
	skipCorrupt bool
	prefetch    *int
}

// LoaderOption configures OpenLoader.
type LoaderOption func(*loaderConfig)

// WithPartition chooses StaticPartition (the default) or DynamicPartition.
func WithPartition(p Partition) LoaderOption { return func(c *loaderConfig) { c.partition = p } }

// WithShuffle shuffles the order of the tasks (runs of records) with the same
// permutation on every rank, derived from seed and the epoch (SetEpoch).
func WithShuffle(seed int64) LoaderOption {
	return func(c *loaderConfig) { c.shuffle, c.seed = true, seed }
}

// WithDropLast drops the tail so every batch is full; without it the static
// partition pads the last batches by wrapping around (every rank still gets
// the same number of batches) and the dynamic one keeps a final partial batch.
func WithDropLast() LoaderOption { return func(c *loaderConfig) { c.dropLast = true } }

// WithSkipCorrupt skips corrupt chunks and counts them (CorruptChunks) instead
// of failing with ErrCorrupt.
func WithSkipCorrupt() LoaderOption { return func(c *loaderConfig) { c.skipCorrupt = true } }

// WithPrefetch sets how many batches the core prepares ahead on its background
// thread (default 2). 0 reads on the goroutine that calls Next: faster when
// little work happens between batches on a machine with few cores.
func WithPrefetch(batches int) LoaderOption {
	return func(c *loaderConfig) { c.prefetch = &batches }
}

// Loader reads this rank's batches of a RecordIO dataset through the Python
// core, which prefetches on a background thread. Use it Scanner-style:
//
//	l, err := pybridge.OpenLoader(g, files, 64, pybridge.WithShuffle(1))
//	...
//	defer l.Close()
//	for epoch := 0; epoch < epochs; epoch++ {
//		l.SetEpoch(epoch)
//		for l.Next() {
//			b := l.Batch()
//			for i := 0; i < b.Len(); i++ {
//				use(b.Record(i))
//			}
//		}
//		if err := l.Err(); err != nil { ... }
//	}
//
// A Loader may be used from one goroutine at a time.
type Loader struct {
	cHandle[*C.pb_loader] // its mu also guards batch and err

	batch      Batch
	err        error
	numRecords int
	group      *Group // what OpenLoaderContext aborts; nil for a single process
}

// Batch is a batch of records in one contiguous buffer: record i is
// Data()[Offsets()[i]:Offsets()[i+1]]. Its memory belongs to the loader and
// is valid only until the next call of Next or Close: copy what must live
// longer (Clone). Do not modify it.
type Batch struct {
	data    []byte
	offsets []int64
}

// Len returns the number of records.
func (b *Batch) Len() int {
	if b == nil || len(b.offsets) == 0 {
		return 0
	}
	return len(b.offsets) - 1
}

// Record returns record i (0 <= i < Len()), a view into the batch's memory.
func (b *Batch) Record(i int) []byte {
	lo, hi := b.offsets[i], b.offsets[i+1]
	return b.data[lo:hi:hi]
}

// Records returns every record as a view into the batch's memory.
func (b *Batch) Records() [][]byte {
	out := make([][]byte, b.Len())
	for i := range out {
		out[i] = b.Record(i)
	}
	return out
}

// Data returns the records' bytes, back to back.
func (b *Batch) Data() []byte { return b.data }

// Offsets returns Len()+1 offsets into Data, starting at 0.
func (b *Batch) Offsets() []int64 { return b.offsets }

// Clone copies the batch into Go memory that stays valid after Next.
func (b *Batch) Clone() *Batch {
	return &Batch{data: append([]byte(nil), b.data...), offsets: append([]int64(nil), b.offsets...)}
}

// OpenLoader opens a loader over files (every rank must pass the same list in
// the same order) with batchSize records per batch. The group's rank and size
// split the data; a nil group reads everything in one process (rank 0 of 1).
// A missing file fails with ErrIO and a corrupt chunk header with ErrCorrupt,
// their messages naming the file, the chunk and its byte offset.
func OpenLoader(g *Group, files []string, batchSize int, opts ...LoaderOption) (*Loader, error) {
	return openLoader(context.Background(), "OpenLoader", g, files, batchSize, opts)
}

// OpenLoaderContext is OpenLoader under ctx (see Contexts). Only a
// DynamicPartition loader waits on the other ranks when it opens (they compare
// what they opened); a ctx that ends while it waits aborts g.
func OpenLoaderContext(ctx context.Context, g *Group, files []string, batchSize int,
	opts ...LoaderOption) (*Loader, error) {
	return openLoader(ctx, "OpenLoaderContext", g, files, batchSize, opts)
}

func openLoader(ctx context.Context, op string, g *Group, files []string, batchSize int,
	opts []LoaderOption) (*Loader, error) {
	c := loaderConfig{}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if len(files) == 0 {
		return nil, newError(statusInvalidArgument, op, "no input files given")
	}
	if len(files) > math.MaxInt32 {
		return nil, newError(statusInvalidArgument, op, "%d files are too many", len(files))
	}
	if batchSize < 1 {
		return nil, newError(statusInvalidArgument, op, "batch size must be positive, got %d", batchSize)
	}
	if c.prefetch != nil && (*c.prefetch < 0 || *c.prefetch > math.MaxInt32) {
		return nil, newError(statusInvalidArgument, op, "prefetch must be in 0..%d, got %d", math.MaxInt32, *c.prefetch)
	}
	var gh *C.pb_group // NULL: a single process
	if g != nil {
		if g.h == nil {
			return nil, newError(statusInvalidArgument, op, "uninitialized *Group")
		}
		gh = g.h
	}
	// The file names go in C memory: cgo forbids passing C a Go pointer to Go pointers.
	cfiles := (**C.char)(C.malloc(C.size_t(len(files)) * C.size_t(unsafe.Sizeof((*C.char)(nil)))))
	names := unsafe.Slice(cfiles, len(files))
	for i, f := range files {
		names[i] = C.CString(f)
	}
	defer func() {
		for _, p := range names {
			C.free(unsafe.Pointer(p))
		}
		C.free(unsafe.Pointer(cfiles))
	}()
	var h *C.pb_loader
	err := underContext(ctx, op, g, func() error {
		var msg *C.char
		return check(op, C.pbgo_loader_open(gh, cfiles, C.int32_t(len(files)), C.int64_t(batchSize),
			C.int32_t(c.partition), cbool(c.shuffle), C.int64_t(c.seed), cbool(c.dropLast),
			cbool(c.skipCorrupt), &h, &msg), msg)
	})
	if err != nil {
		if h != nil {
			C.pbgo_loader_close(h, nil)
		}
		return nil, err
	}
	var msg *C.char
	l := &Loader{group: g}
	l.h = h
	if c.prefetch != nil {
		if err := check(op, C.pbgo_loader_set_prefetch(h, C.int32_t(*c.prefetch), &msg), msg); err != nil {
			C.pbgo_loader_close(h, nil)
			return nil, err
		}
	}
	info, err := l.info(op)
	if err != nil {
		C.pbgo_loader_close(h, nil)
		return nil, err
	}
	l.numRecords = int(info[1])
	return l, nil
}

func cbool(b bool) C.int32_t {
	if b {
		return 1
	}
	return 0
}

// Next reads the next batch of the current pass; it returns false when the
// pass ends or on an error (see Err). The Next after a false starts the next
// pass: call SetEpoch before it to change the shuffle.
//
// A false with a nil Err says that this rank has no more batches this epoch.
// Under DynamicPartition the ranks' batch counts then differ: a rank that runs
// out joins its reducer (Reducer.Join, with WithJoin) so that the others
// finish their steps without waiting for it.
func (l *Loader) Next() bool { return l.next(context.Background(), "Loader.Next") }

// NextContext is Next under ctx (see Contexts): a ctx already done reads nothing
// (false, and Err returns ErrCanceled wrapping ctx's error). A read once started is
// not interrupted: it waits on no other process but, under DynamicPartition, the
// store's host for its next claim (bounded by the group's timeout).
func (l *Loader) NextContext(ctx context.Context) bool { return l.next(ctx, "Loader.NextContext") }

func (l *Loader) next(ctx context.Context, op string) bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.batch, l.err = Batch{}, nil
	h, err := l.live(op, "loader is closed")
	if err != nil {
		l.err = err
		return false
	}
	var data *C.uint8_t
	var offsets *C.int64_t
	var count C.int64_t
	var has C.int32_t
	l.err = underContext(ctx, op, nil, func() error {
		var msg *C.char
		return check(op, C.pbgo_loader_next(h, &data, &offsets, &count, &has, &msg), msg)
	})
	if l.err != nil {
		return false
	}
	if has == 0 {
		return false
	}
	n := int(count)
	offs := unsafe.Slice((*int64)(unsafe.Pointer(offsets)), n+1)
	var buf []byte
	if size := offs[n]; size > 0 {
		buf = unsafe.Slice((*byte)(unsafe.Pointer(data)), int(size))
	}
	l.batch = Batch{data: buf, offsets: offs}
	return true
}

// Batch returns the batch that the last Next read. It is valid until the
// next Next or Close.
func (l *Loader) Batch() *Batch {
	if l == nil {
		return &Batch{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.batch
	return &b
}

// Err returns the error that ended the last Next, or nil at the end of a pass.
func (l *Loader) Err() error {
	if l == nil {
		return nilError("Loader.Err", "Loader")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// SetEpoch sets the epoch of the next pass (it changes the shuffle).
func (l *Loader) SetEpoch(epoch int) error {
	const op = "Loader.SetEpoch"
	h, err := l.handle(op)
	if err != nil {
		return err
	}
	if epoch < 0 {
		return newError(statusInvalidArgument, op, "epoch must be >= 0, got %d", epoch)
	}
	var msg *C.char
	return check(op, C.pbgo_loader_set_epoch(h, C.int64_t(epoch), &msg), msg)
}

// Epoch returns the epoch of the current or next pass: the last SetEpoch's, or
// the saved epoch after Checkpoint.Restore (continue the training loop from it).
func (l *Loader) Epoch() (int, error) {
	const op = "Loader.Epoch"
	h, err := l.handle(op)
	if err != nil {
		return 0, err
	}
	var e C.int64_t
	var msg *C.char
	err = check(op, C.pbgo_loader_epoch(h, &e, &msg), msg)
	return int(e), err
}

// NumBatches returns the number of batches per pass on this rank, the same on
// every rank under StaticPartition; -1 under DynamicPartition.
func (l *Loader) NumBatches() (int, error) {
	info, err := l.info("Loader.NumBatches")
	return int(info[0]), err
}

// NumRecords returns the number of records of the whole dataset.
func (l *Loader) NumRecords() int {
	if l == nil {
		return 0
	}
	return l.numRecords
}

// CorruptChunks returns the number of corrupt chunks skipped so far (WithSkipCorrupt).
func (l *Loader) CorruptChunks() (int, error) {
	info, err := l.info("Loader.CorruptChunks")
	return int(info[2]), err
}

func (l *Loader) info(op string) ([3]int64, error) {
	var info [3]C.int64_t
	h, err := l.handle(op)
	if err != nil {
		return [3]int64{}, err
	}
	var msg *C.char
	err = check(op, C.pbgo_loader_info(h, &info[0], &msg), msg)
	return [3]int64{int64(info[0]), int64(info[1]), int64(info[2])}, err
}

// Close stops prefetching and closes the files; batches from Batch become
// invalid. Closing again returns nil.
func (l *Loader) Close() error {
	const op = "Loader.Close"
	if l == nil {
		return nilError(op, "Loader")
	}
	return l.close(op, func(h *C.pb_loader, msg **C.char) C.int {
		l.batch = Batch{}
		return C.pbgo_loader_close(h, msg)
	})
}

func (l *Loader) handle(op string) (*C.pb_loader, error) {
	if l == nil {
		return nil, nilError(op, "Loader")
	}
	return l.get(op, "loader is closed")
}
