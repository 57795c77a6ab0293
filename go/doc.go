// Package pybridge runs data-parallel training over torch.distributed from Go:
// collectives, bucketed gradient reduction and a sharded RecordIO loader. It wraps the C library libpybridge (capi/pybridge.h),
// which embeds the Python core; cgo finds it with pkg-config (package name
// "pybridge"), so build with PKG_CONFIG_PATH pointing at the directory that
// holds pybridge.pc.
//
// # Launching
//
// Start one process per rank with pybridge-launch (or torchrun), which sets
// RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT and PYBRIDGE_DEVICE:
//
//	pybridge-launch --nproc-per-node 2 ./prog
//
// and call Init with no options; options override the environment.
// FromLaunchEnv returns the same variables, with the rank's device.
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
// goroutines that issue collectives concurrently on one group must be ordered by
// the program, or each use its own group (Group.Split): each rank's scheduler orders
// them its own way. WithChecked names such calls as a mismatch (both calls, every
// rank) instead of letting a rank abort or hang.
//
// # Gradient reduction
//
// NewReducer creates bucketed gradient reduction over a program's parameters.
// The library owns the flat buckets; Grad returns a slice over a gradient's
// place in them. A program writes each gradient during its backward pass and
// calls MarkReady as soon as it is complete, which starts that bucket's
// allreduce while backward goes on; Wait returns once every bucket is averaged
// (or summed). BroadcastParams copies rank 0's initial parameters to all ranks.
//
// # Data
//
// OpenLoader reads RecordIO shards in batches, each rank its own share (static
// or dynamic partition), Scanner-style: for l.Next() { b := l.Batch() }, then
// l.Err(). The sub-package recordio reads and writes the format in pure Go.
//
// # Federated training
//
// NewFedServer (rank 0) and NewFedWorker (the other ranks) run federated
// learning with asynchronous client assignment: the server hands clients to
// workers as they finish and aggregates their results with FedAvg; a worker is
// a loop the program drives (Next, then Submit or Fail). Both interoperate
// with Python and C peers (docs/federated.md).
//
// # Elastic training
//
// Under pybridge-launch --elastic, ElasticInit joins the job and RunElastic
// runs the training function over an ElasticState (a Checkpoint's slices,
// loader and reducer, committed in memory): when a peer dies, or a new process
// waits to join at a Commit, the current call returns ErrMembership, and
// RunElastic resets every rank onto the new world, rolled back to the last
// commit, and calls the function again. No process restarts (docs/elastic.md).
//
// # Observability
//
// StartObserve before Init (or PYBRIDGE_TRACE=DIR in the environment) records
// each rank: a Chrome trace of the library's collectives, reducer buckets,
// loader and steps, metrics rows and TensorBoard scalars. The program adds its
// own spans (StartSpanCat(name, CatForward) ... End, WithSpan), instants and
// scalars (LogScalar); while nothing records, these cost no cgo call.
//
// # Errors
//
// Functions return errors (never panic, also for a nil *Group); each is an
// *Error carrying the library's status code and message, and errors.Is
// matches it against ErrTimeout, ErrComm, ErrClosed and the other sentinels.
package pybridge
