// Package pybridge runs data-parallel training collectives over
// torch.distributed from Go. It wraps the C library libpybridge (capi/pybridge.h),
// which embeds the Python core; cgo finds it with pkg-config (package name
// "pybridge"), so build with PKG_CONFIG_PATH pointing at the directory that
// holds pybridge.pc.
//
// # Launching
//
// Start one process per rank with a launcher that sets RANK, WORLD_SIZE,
// LOCAL_RANK, MASTER_ADDR and MASTER_PORT, for example
//
//	python3 -m torch.distributed.run --standalone --nproc-per-node 2 --no-python ./prog
//
// and call Init with no options; options override the environment.
//
// # Collectives
//
// AllReduce, Broadcast, AllGather, ReduceScatter, Send and Recv work in place
// on Go slices of any Numeric type, without copying: the library reads and
// writes the slice's memory during the call. Slices are host memory, so they
// need the gloo backend. Asynchronous variants (AllReduceAsync and so on) work
// on library-owned Buffers and return a Work to Wait on, because cgo does not
// allow C to keep a Go pointer once a call has returned.
//
// Every rank must issue collectives in the same order: they are matched by
// sequence, not by name. All functions may be called from any goroutine, but
// goroutines that issue collectives concurrently must be ordered by the program.
//
// # Errors
//
// Functions return errors (never panic, also for a nil *Group); each is an
// *Error carrying the library's status code and message, and errors.Is
// matches it against ErrTimeout, ErrComm, ErrClosed and the other sentinels.
package pybridge
