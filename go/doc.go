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
// and call Init with no options; options override the environment. Started by srun
// or mpirun instead, with nothing exported, Init reads SLURM's, Open MPI's or PMI's
// variables. FromLaunchEnv returns what Init reads, by the same rule, with the rank's
// device.
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
// # Options
//
// Every constructor takes what it needs and then functional options:
// Init(WithBackend("gloo")), NewReducer(g, specs, WithHook(HookFP16)),
// OpenLoader(g, files, 32, WithShuffle(1)), NewCheckpoint(g, dir, WithLoader(l)),
// NewAverager[float32](g, 8, WithWarmupSteps(100)), NewFedServer[float32](g,
// WithFedMode(FedBuff)). Where the C ABI takes an options struct, the options fill
// it after its C *_init function (pb_reducer_options_init, pb_diloco_options_init,
// pb_fed_options_init), the one source of the defaults; elsewhere an option not given reaches the library as
// "not given" and the library decides. WithBackend and WithTimeout are WorldOptions,
// which Init and ElasticInit both take; WithElasticStore is ElasticInit's alone.
//
// # Contexts
//
// Every call that waits on other processes has a ...Context variant that takes a
// context.Context first, as database/sql's QueryContext and net's DialContext do
// (InitContext, BarrierContext, AllReduceContext, NewReducerContext, Reducer.JoinContext,
// FedWorker.NextContext, ...); the call without it is that variant with
// context.Background(). Three rules:
//
//   - A context already done starts nothing: the call returns ErrCanceled at once.
//   - A context that ends while the call waits ends it. The error is an *Error of
//     status ErrCanceled whose Err is ctx.Err(): errors.Is(err, ErrCanceled) holds, and
//     so does errors.Is(err, context.DeadlineExceeded) (or context.Canceled). gloo and
//     NCCL cannot cancel a collective once started, so the call's group is aborted, as
//     torch's ProcessGroup abort does (pb_group_abort): gloo's connections are shut down,
//     so that the blocked call returns at once and the peers' calls that wait on this
//     rank fail (ErrComm); an NCCL communicator is aborted. The group and its subgroups
//     are of no further use: every later call on them returns ErrClosed saying they were
//     aborted; close them (the world: Close, and Init again). The group is the one the
//     call takes; a Reducer's, Averager's, DiLoCo's, FedServer's and FedWorker's is the group it
//     was made on, a Checkpoint's and ElasticState's the Checkpoint's.
//   - InitContext, ElasticInitContext and ElasticState.ResetContext have no group yet
//     while they wait for the store and their peers: an ended context ends that wait
//     (pb_init_abort), a world already formed is left, and no group is returned.
//
// Waits that can be given up without aborting anything do just that: Work.WaitContext
// and Reducer.WaitContext return ErrCanceled and the operation goes on, so a later
// Wait returns its result. Calls that wait on no other process are not interrupted
// once started, so their context only gates the start: Loader.NextContext,
// Checkpoint.SaveContext, FedServer.AggregateContext and FedWorker.SubmitContext,
// SubmitMetricsContext and FailContext. The asynchronous starts (AllReduceAsync, ...)
// take no context: they return at once (in checked mode once the call is verified,
// bounded by the group's timeout); wait for them with WaitContext. Each call is tested
// on 2 ranks with a deadline and the other rank never making its side of the call
// (go/context_test.go).
//
// # Errors
//
// Functions return errors (never panic, also for a nil *Group); each is an
// *Error carrying the library's status code and message, and errors.Is
// matches it against ErrTimeout, ErrComm, ErrClosed, ErrCanceled and the other
// sentinels, which are constants.
package pybridge
