/*
 * pybridge.h - the C interface of pybridge: data-parallel training over
 * torch.distributed for programs written in C, Go or any language with a C FFI.
 *
 * Link with libpybridge.so (pkg-config name: pybridge). The library embeds the
 * Python interpreter that owns torch.distributed; it starts on the first call.
 *
 * CONVENTIONS (they hold for every function below unless its comment says otherwise)
 *
 *  Status.    Every function returns an int status: PB_OK (0) or a negative
 *             PB_ERR_* code. After a failure, pb_last_error() returns a message
 *             saying what was wrong, in C's names, after the name of the function
 *             that failed ("pb_init: ..."). The message is the calling thread's, not the
 *             handle's: read it on the thread that got the status, before that
 *             thread's next call (docs/c-api.md says why). Nothing here aborts,
 *             raises or longjmps: NULL pointers, bad counts, unknown codes, stale
 *             handles and calls out of order all return an error status.
 *
 *  Memory.    Synchronous calls read and write the caller's memory, described by
 *             a pb_tensor, only while the call runs; they do not copy it (host and
 *             CUDA memory are wrapped in place). Asynchronous calls work on
 *             pb_buffer objects, whose memory the library owns, or (the
 *             pb_*_tensor_async calls) on memory the caller keeps valid until the
 *             work completes; never on memory a garbage collector may move.
 *
 *  Streams.   CUDA memory is used in the order of the calling thread's current
 *             CUDA stream of the process's libtorch (the device's default stream
 *             unless the program made another current): it must be ready in that
 *             stream's order when the call is made; a blocking call's result is
 *             ready in that stream's order when it returns (the stream waits for
 *             the communication), an asynchronous call's once its work completes.
 *             This is torch.distributed's rule, which pybridge inherits; link the
 *             torch wheel's libtorch (pybridge-capi --torch-libs) so that the
 *             program and the library share one current stream. Another stream:
 *             per group with pb_group_set_stream, per call by making it current in
 *             libtorch around the call. NOT YET RUN ON A GPU.
 *
 *  Handles.   pb_group, pb_buffer, pb_work and the others are opaque handles. A
 *             handle that was closed, or never issued by this library, is rejected
 *             with PB_ERR_INVALID_ARGUMENT or PB_ERR_CLOSED, never dereferenced.
 *             Every handle is released by its pb_X_close (the world group: by
 *             pb_finalize); the older pb_X_free names are deprecated aliases.
 *
 *  Threads.   Every function may be called from any thread. Calls are serialized
 *             inside the library (the embedded interpreter's lock) but a blocking
 *             collective does not stop other threads' calls. COLLECTIVES MUST BE
 *             ISSUED IN THE SAME ORDER ON EVERY RANK: when several threads issue
 *             collectives concurrently, the caller must order them.
 *
 *  Signals.   The library installs no signal handlers; SIGINT and SIGTERM stay
 *             the host program's.
 *
 *  Elastic.   In an elastic world (pb_elastic_init) any call that communicates
 *             (a collective, the reducer, the loader, pb_state_commit) may return
 *             PB_ERR_MEMBERSHIP: ranks were lost or new ones wait to join, and the
 *             next world is already agreed on. It is not a failure: roll back and
 *             go on with pb_state_reset, in a loop that needs no callbacks:
 *               for (;;) {
 *                 rc = train(world, step);           // returns the first status != PB_OK
 *                 if (rc != PB_ERR_MEMBERSHIP) break;
 *                 do rc = pb_state_reset(state, ..., &world, &step);
 *                 while (rc == PB_ERR_MEMBERSHIP);   // another change during the reset
 *                 if (rc != PB_OK) break;
 *               }
 *               if (rc == PB_OK) pb_elastic_finish(world);   // no joiners from now on
 */
#ifndef PYBRIDGE_H
#define PYBRIDGE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Status codes ---------------------------------------------------------- */
#define PB_OK 0
#define PB_ERR_INVALID_ARGUMENT -1  /* NULL pointer, bad count, unknown code, bad rank or handle */
#define PB_ERR_NOT_INITIALIZED -2   /* the call needs a process group: call pb_init first */
#define PB_ERR_ALREADY_INITIALIZED -3 /* pb_init called while a group is live */
#define PB_ERR_TIMEOUT -4           /* a peer did not join or answer within the timeout */
#define PB_ERR_COMM -5              /* a peer failed or a connection broke */
#define PB_ERR_IO -6                /* a file could not be read or written */
#define PB_ERR_CORRUPT -7           /* data failed a format or checksum check */
#define PB_ERR_INTERNAL -8          /* a bug, or the embedded Python core failed to start */
#define PB_ERR_CLOSED -9            /* the object was closed or finalized */
#define PB_ERR_MEMBERSHIP -10       /* elastic: ranks were lost or joined; reset onto the new world */
#define PB_ERR_CANCELED -11         /* ended by pb_group_abort or pb_init_abort from another thread */

/* ---- Element types (pb_tensor.dtype) ---------------------------------------- */
#define PB_FLOAT32 0
#define PB_FLOAT64 1
#define PB_FLOAT16 2  /* IEEE half: raw uint16 bits */
#define PB_BFLOAT16 3 /* bfloat16: raw uint16 bits */
#define PB_INT8 4
#define PB_UINT8 5
#define PB_INT32 6
#define PB_INT64 7
/* Not an element type: the descriptor names a libtorch tensor by handle. data is the
 * program's at::Tensor* (gotch's Tensor.Ctensor(), GoTorch's C.Tensor, Rust tch's
 * as_ptr(), &t in C++) in the process's one libtorch; count and device are ignored.
 * The library reads dtype, device, size and storage from libtorch itself, so there is
 * nothing to describe by hand, and holds a reference to the tensor for as long as it
 * uses it: an asynchronous call keeps the tensor alive until its work is closed, even if
 * the program frees its handle before (a finalizer, say). Accepted wherever a pb_tensor
 * is taken. Refused with PB_ERR_INVALID_ARGUMENT naming the reason: a NULL handle, an
 * undefined tensor, a sparse or other non-strided one, a dtype outside the eight above,
 * a non-contiguous one (pass a contiguous copy and copy the result back), a CUDA tensor
 * on another device than the process's current one. In C:
 *   pb_tensor t = {&x, 0, PB_TORCH_TENSOR, PB_CPU};   (at::Tensor x) */
#define PB_TORCH_TENSOR 64

/* ---- Reduction operations ------------------------------------------------------ */
#define PB_SUM 0
#define PB_AVG 1     /* floating-point types only */
#define PB_MIN 2
#define PB_MAX 3
#define PB_PRODUCT 4

/* ---- Devices (pb_tensor.device) ------------------------------------------------ */
#define PB_CPU -1    /* host memory; a value >= 0 is a CUDA device index */

/* A contiguous block of `count` elements of type `dtype` at `data`. */
typedef struct pb_tensor {
    void *data;      /* may be NULL only when count is 0 */
    int64_t count;   /* number of elements, >= 0 */
    int32_t dtype;   /* PB_FLOAT32 ... PB_INT64 */
    int32_t device;  /* PB_CPU or a CUDA device index */
} pb_tensor;

typedef struct pb_group pb_group;   /* the process group */
typedef struct pb_buffer pb_buffer; /* library-owned memory for asynchronous calls */
typedef struct pb_work pb_work;     /* an asynchronous operation in flight */

/* ---- DLPack: tensors of other frameworks ------------------------------------ */
/* DLPack (dlpack.h) is the tensor exchange standard of torch, JAX/XLA, CuPy and TVM.
 * Include dlpack.h before this header, or pass the pointer as you have it. */
struct DLManagedTensor;
struct DLManagedTensorVersioned;

/* Describe a DLPack tensor as a pb_tensor in *out, without copying: out->data points at
 * the tensor's memory (its data plus byte_offset), out->count is the product of its
 * shape. Ownership stays with the caller, who keeps the DLManagedTensor alive while the
 * descriptor is used and calls its deleter afterwards; nothing here calls the deleter.
 * Supported: dtypes float32/64, float16, bfloat16, int8, uint8, int32, int64 (lanes 1);
 * devices kDLCPU and kDLCUDAHost (PB_CPU) and kDLCUDA (its device_id); strides NULL or
 * those of one compact row-major block.
 * Errors: PB_ERR_INVALID_ARGUMENT naming what is unsupported: a NULL pointer, the dtype,
 * the device (or a CUDA device this process does not have), non-contiguous strides. */
int pb_tensor_from_dlpack(const struct DLManagedTensor *src, pb_tensor *out);

/* The same for DLPack 1.0's versioned tensor. Also refused: another major version, and
 * a tensor flagged DLPACK_FLAG_BITMASK_READ_ONLY (collectives write in place). */
int pb_tensor_from_dlpack_versioned(const struct DLManagedTensorVersioned *src, pb_tensor *out);

/* ---- Errors and version (pure C: usable before and without the Python core) ---- */

/* The message of the last failed call on the calling thread, or "" if none.
 * The string is owned by the library and valid until the thread's next failing call. */
const char *pb_last_error(void);

/* The constant name of a status code, e.g. "PB_ERR_TIMEOUT"; "PB_UNKNOWN" otherwise. */
const char *pb_status_name(int status);

/* The library version, e.g. "0.1.0". */
const char *pb_version(void);

/* ---- Python modules: hooks and strategies registered by name ---------------------- */

/* Import the Python module `name` (e.g. "my_hooks", a dotted name for a submodule) into the
 * library's interpreter: a module that registers comm hooks (pybridge.register_comm_hook)
 * or server strategies (pybridge.federated.register_strategy), which
 * pb_reducer_options.hook_name and pb_fed_options.strategy_name then choose by name. It
 * is found on the interpreter's sys.path (PYBRIDGE_PYTHONPATH puts folders first); a
 * module already imported is not run again. Every process that chooses a registered name
 * imports its module first. Needs no pb_init.
 * Errors: PB_ERR_INVALID_ARGUMENT when `name` is NULL or empty, the module is not found,
 * or it raises while importing (its exception in the message). */
int pb_import_module(const char *name);

/* ---- Process group ------------------------------------------------------------ */

/* Join the process group and store its handle in *out.
 *   init_method  "env://" (default when NULL or ""), "tcp://host:port" or "file:///path".
 *                env:// reads MASTER_ADDR and MASTER_PORT as torchrun and pybridge-launch set them.
 *   backend      "auto" (default when NULL or ""), "gloo" or "nccl". auto picks nccl when CUDA
 *                is present, gloo otherwise.
 *   rank, world_size, local_rank
 *                this process's rank, the number of ranks, and the rank on this node;
 *                -1 reads RANK, WORLD_SIZE and LOCAL_RANK from the environment.
 *   timeout_seconds
 *                bounds the rendezvous and every later collective; <= 0 means 300 s.
 *                Every timeout of this header is at most 1e7 s; NaN and infinity are
 *                PB_ERR_INVALID_ARGUMENT, as are element counts of more than 2^47 bytes.
 * Errors: PB_ERR_ALREADY_INITIALIZED if a group is live; PB_ERR_TIMEOUT if a peer does
 * not join in time (rank 0, the store's host, missing: within the timeout, naming it);
 * PB_ERR_INVALID_ARGUMENT for bad values, a missing environment, or a file:// path whose
 * directory does not exist. */
int pb_init(const char *init_method, const char *backend, int32_t rank, int32_t world_size,
            int32_t local_rank, double timeout_seconds, pb_group **out);

/* Flags for pb_init_v2 (OR them together). */
#define PB_INIT_CHECKED 1  /* checked mode: before each collective the ranks compare its
                              sequence number, op, dtype, count and root (or, for pb_send and
                              pb_recv, count and dtype with the peer) and all fail with
                              PB_ERR_INVALID_ARGUMENT naming the ranks that differ, instead of
                              aborting or returning garbage. One extra small allgather per
                              collective. Without the flag, PYBRIDGE_CHECKED=1 turns it on.
                              Every rank must use the same mode (pb_init_v2 fails otherwise). */

/* pb_init with options (as sqlite3_open_v2).
 *   flags             0 or PB_INIT_* flags.
 *   watchdog_seconds  the hang watchdog: a collective unfinished after this long is
 *                     reported to stderr with the ranks that have not reached it. 0 reads
 *                     PYBRIDGE_WATCHDOG (seconds, 0 or "off"), else min(60 s, timeout / 2);
 *                     < 0 turns it off (errors then name the operation but not the ranks).
 * Every rank publishes its rank, host and pid: ranks disagreeing on the world size or
 * checked mode all get PB_ERR_INVALID_ARGUMENT; ranks that never join are named in the
 * PB_ERR_TIMEOUT message. pb_init(...) is pb_init_v2(..., 0, 0, out). */
int pb_init_v2(const char *init_method, const char *backend, int32_t rank, int32_t world_size,
               int32_t local_rank, double timeout_seconds, int32_t flags, double watchdog_seconds,
               pb_group **out);

/* Leave the process group. The handle stays known but every later use returns
 * PB_ERR_CLOSED; a second pb_finalize on it is a no-op returning PB_OK. */
int pb_finalize(pb_group *group);

/* This process's rank in the group, the group's size, the rank on this node. */
int pb_rank(pb_group *group, int32_t *out);
int pb_size(pb_group *group, int32_t *out);
int pb_local_rank(pb_group *group, int32_t *out);

/* Where this process sits in its job, by the rule pb_init follows when rank, world_size
 * and local_rank are -1: the launcher's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
 * else SLURM's (srun), Open MPI's (mpirun) or PMI's variables; the rendezvous from
 * MASTER_ADDR and MASTER_PORT, else as srun and mpirun imply it. *local_rank is the rank
 * when nothing says (as pb_init assumes), *local_world_size -1, *master_port -1 and
 * master_addr "" when nothing says. master_addr receives at most master_addr_size bytes
 * with the terminating NUL (NULL with size 0: not wanted). Needs no process group.
 * Errors: PB_ERR_INVALID_ARGUMENT, naming the variables, when rank and world size are
 * unknown, a variable is not an integer, a launcher's variable and a scheduler's
 * disagree, or the address does not fit. */
int pb_job_env(int32_t *rank, int32_t *world_size, int32_t *local_rank, int32_t *local_world_size,
               char *master_addr, int32_t master_addr_size, int32_t *master_port);

/* Abort `group` from any thread, as torch's ProcessGroup abort: a call blocked on it or on
 * one of its subgroups (a collective, a barrier, a point-to-point message, an
 * asynchronous operation's wait, a reducer's buckets, a subgroup's creation, a federated
 * server's or worker's wait) returns PB_ERR_CANCELED at once, and every later call on them
 * returns PB_ERR_CLOSED naming `reason` (NULL: "aborted"). gloo cannot cancel an operation:
 * the group's connections are shut down, so that its peers' calls that wait on this rank
 * fail too (PB_ERR_COMM); an NCCL communicator is aborted (ncclCommAbort). The handle stays
 * to be released (pb_finalize, pb_group_close); aborting again does nothing. What is
 * local (a loader's files, a checkpoint's write) is not interrupted. */
int pb_group_abort(pb_group *group, const char *reason);

/* End the pb_init, pb_init_v2, pb_elastic_init or pb_state_reset that another thread of
 * this process has in progress: its waits for peers and for the store return
 * PB_ERR_CANCELED, and a world it already formed is aborted as by pb_group_abort and left.
 * With none in progress it does nothing (call it again if the other thread may not have
 * started yet). */
int pb_init_abort(const char *reason);

/* ---- Subgroups ------------------------------------------------------------------
 * A subgroup is a pb_group like the world: every function that takes a group takes a
 * subgroup, and ranks passed with it (roots, peers, member lists) are ranks WITHIN that
 * group, 0 .. size-1. Close subgroups with pb_group_close; pb_finalize on the world closes
 * them all (their handles then return PB_ERR_CLOSED). */

/* MPI_Comm_split: COLLECTIVE over `parent`, every member calls it. Members passing the
 * same color form one subgroup, ranked by (key, rank in parent). A negative color joins
 * no group: *out is set to NULL and PB_OK returned. */
int pb_group_split(pb_group *parent, int32_t color, int32_t key, pb_group **out);

/* The subgroup of the `n` members of `parent` whose parent ranks are listed, in that
 * order. Called by those members (others may call it and get *out = NULL at once);
 * members must create their groups in the same order. */
int pb_group_new(pb_group *parent, const int32_t *ranks, int32_t n, pb_group **out);

/* pb_group_split with the subgroup's backend chosen: "gloo", "nccl", or NULL / "" / "auto"
 * for the parent's. The usual use: a gloo group beside an nccl world for host-memory
 * traffic (metrics, Go slices, the loader), as torch's new_group(backend="gloo"):
 * pb_group_split_backend(world, 0, rank, "gloo", &host). */
int pb_group_split_backend(pb_group *parent, int32_t color, int32_t key, const char *backend,
                           pb_group **out);

/* This rank's intra-node group and cross-node group (members with the same local rank on
 * every node). Nodes are consecutive blocks of ranks_per_node ranks of `parent`; <= 0
 * reads LOCAL_WORLD_SIZE (set by pybridge-launch and torchrun). COLLECTIVE over parent. */
int pb_group_nodes(pb_group *parent, int32_t ranks_per_node, pb_group **intra, pb_group **cross);

/* The global rank of member `group_rank`, and the group rank of global rank `global_rank`
 * (PB_ERR_INVALID_ARGUMENT naming the members when it is not one). */
int pb_group_global_rank(pb_group *group, int32_t group_rank, int32_t *out);
int pb_group_rank_of(pb_group *group, int32_t global_rank, int32_t *out);

/* Close a subgroup (and its own subgroups); the handle is then unknown. The world group
 * is left with pb_finalize, not closed here (PB_ERR_INVALID_ARGUMENT). */
int pb_group_close(pb_group *group);

/* Deprecated: use pb_group_close (the same function, under the name every handle's
 * destructor has: pb_X_close). */
int pb_group_free(pb_group *group);

/* Order this group's calls on CUDA memory on `cuda_stream` (a cudaStream_t, passed as a
 * pointer) instead of the calling thread's current libtorch stream; NULL goes back to the
 * current stream. The stream contract (CONVENTIONS, Streams) then holds with this stream
 * in place of the current one: tensors ready in its order when a call is made, a blocking
 * call's result ready in its order on return, an asynchronous call's once its work
 * completes; a reducer on this group copies and reduces on it too. For a stream per call,
 * set it before the call, or make the stream current in libtorch around the call
 * (c10::cuda::CUDAStreamGuard). The stream must outlive its use. Subgroups start without
 * one. Errors: PB_ERR_INVALID_ARGUMENT when a non-NULL stream is given and this process's
 * torch has no CUDA device. NOT YET RUN ON A GPU. */
int pb_group_set_stream(pb_group *group, void *cuda_stream);

/* The device this rank should compute on: its CUDA index under nccl, PB_CPU under gloo. */
int pb_device(pb_group *group, int32_t *out);

/* Block until every rank has called pb_barrier. */
int pb_barrier(pb_group *group);

/* ---- Synchronous collectives (in place on caller memory) ------------------------- */

/* Errors of a collective name it and its sequence number on the group ("all_reduce #12
 * (4096 bytes) on the world group: ..."); a PB_ERR_COMM or PB_ERR_TIMEOUT also names the
 * ranks that died, are late or never started it (docs/failures.md).
 *
 * Copy `t` from rank `root` into `t` on every rank. Every rank passes the same count and dtype. */
int pb_broadcast(pb_group *group, const pb_tensor *t, int32_t root);

/* Reduce `t` element-wise over all ranks with `op` (PB_SUM ... PB_PRODUCT), in place. */
int pb_all_reduce(pb_group *group, const pb_tensor *t, int32_t op);

/* Concatenate every rank's `input` in rank order into `output`,
 * which holds world_size x input->count elements of the same dtype. */
int pb_all_gather(pb_group *group, const pb_tensor *input, const pb_tensor *output);

/* Reduce `input` (world_size x output->count elements) over ranks with `op`;
 * rank r receives block r of the result in `output`. */
int pb_reduce_scatter(pb_group *group, const pb_tensor *input, const pb_tensor *output,
                      int32_t op);

/* Send `t` to rank `dst` / receive into `t` from rank `src`. A send matches the
 * receive on the peer with the same tag (>= 0); count and dtype must agree. */
int pb_send(pb_group *group, const pb_tensor *t, int32_t dst, int32_t tag);
int pb_recv(pb_group *group, const pb_tensor *t, int32_t src, int32_t tag);

/* ---- Library-owned buffers --------------------------------------------------------- */

/* Allocate `count` zeroed elements of `dtype` on `device`; store the handle in *out. */
int pb_buffer_new(int32_t dtype, int64_t count, int32_t device, pb_buffer **out);

/* Describe the buffer's memory in *out. The pointer stays valid until pb_buffer_close;
 * the caller may read and write it, except while an operation on it is in flight. */
int pb_buffer_tensor(pb_buffer *buffer, pb_tensor *out);

/* Release the buffer. Memory still used by an operation in flight is released
 * when that operation finishes, but the caller must not touch it after this call. */
int pb_buffer_close(pb_buffer *buffer);

/* Deprecated: use pb_buffer_close (the same function). */
int pb_buffer_free(pb_buffer *buffer);

/* ---- Asynchronous operations (on library-owned buffers) ------------------------------ */
/* Each starts the operation and stores a work handle in *work; the result is in the
 * buffer once pb_work_wait returns PB_OK or pb_work_test reports done. */

int pb_broadcast_async(pb_group *group, pb_buffer *buffer, int32_t root, pb_work **work);
int pb_all_reduce_async(pb_group *group, pb_buffer *buffer, int32_t op, pb_work **work);
int pb_all_gather_async(pb_group *group, pb_buffer *input, pb_buffer *output, pb_work **work);
int pb_reduce_scatter_async(pb_group *group, pb_buffer *input, pb_buffer *output, int32_t op,
                            pb_work **work);
int pb_isend(pb_group *group, pb_buffer *buffer, int32_t dst, int32_t tag, pb_work **work);
int pb_irecv(pb_group *group, pb_buffer *buffer, int32_t src, int32_t tag, pb_work **work);

/* ---- Asynchronous operations on caller-owned memory ---------------------------------- */
/* The same operations on memory the caller owns and keeps (a libtorch or CUDA tensor,
 * malloc'd memory, a DLPack tensor), described by a pb_tensor: the descriptor is read
 * during the call, the memory it describes is kept and used until the work completes.
 * The caller must keep that memory valid, and neither read nor write it, until
 * pb_work_wait returns or pb_work_test reports done (for a send: must not write it).
 * Not for memory a garbage collector may move or free (Go slices: use pb_buffer).
 * Errors as for the synchronous calls, checked before anything starts. */
int pb_all_reduce_tensor_async(pb_group *group, const pb_tensor *t, int32_t op, pb_work **work);
int pb_broadcast_tensor_async(pb_group *group, const pb_tensor *t, int32_t root, pb_work **work);
int pb_all_gather_tensor_async(pb_group *group, const pb_tensor *input, const pb_tensor *output,
                               pb_work **work);
int pb_reduce_scatter_tensor_async(pb_group *group, const pb_tensor *input, const pb_tensor *output,
                                   int32_t op, pb_work **work);
int pb_isend_tensor(pb_group *group, const pb_tensor *t, int32_t dst, int32_t tag, pb_work **work);
int pb_irecv_tensor(pb_group *group, const pb_tensor *t, int32_t src, int32_t tag, pb_work **work);

/* Wait for the operation; timeout_seconds <= 0 waits up to the group's timeout.
 * Returns the operation's own status (e.g. PB_ERR_COMM if a peer died) once done.
 * PB_ERR_TIMEOUT when timeout_seconds pass first means "not finished yet": the
 * operation goes on, and a later pb_work_wait or pb_work_test reports its result. */
int pb_work_wait(pb_work *work, double timeout_seconds);

/* Store 1 in *done if the operation has finished (and return its status), else 0. */
int pb_work_test(pb_work *work, int32_t *done);

/* Release the work handle. Closing unfinished work does not cancel it. */
int pb_work_close(pb_work *work);

/* Deprecated: use pb_work_close (the same function). */
int pb_work_free(pb_work *work);

/* ---- RecordIO loader ------------------------------------------------------------ */
/* Batches of this rank's share of a RecordIO dataset (file format: docs/design.md), read by
 * the Python core with background prefetch. Each batch is one contiguous byte buffer
 * plus offsets: record i is data[offsets[i] .. offsets[i+1]).
 *
 * Errors while reading: PB_ERR_IO (a file is missing or unreadable) and PB_ERR_CORRUPT
 * (bad magic, checksum mismatch, truncated chunk, unknown compressor, a record running
 * past its chunk...). Their messages name the file, the chunk index and the chunk's byte
 * offset, e.g. "pb_loader_next: data.recordio: chunk 3, byte offset 1234: checksum
 * mismatch ...". No record of a corrupt chunk is ever returned, unless skip_corrupt. */

typedef struct pb_loader pb_loader; /* an open loader */

#define PB_PARTITION_STATIC 0  /* fixed disjoint shares, equal batch counts on every rank */
#define PB_PARTITION_DYNAMIC 1 /* ranks claim tasks through the group's store on demand */

/* Open a loader over `nfiles` files (paths, read in this order; every rank must pass the
 * same list) and store its handle in *out.
 *   group        the process group whose rank and size split the data, or NULL for a
 *                single process reading everything (rank 0 of 1).
 *   batch_size   records per batch, >= 1.
 *   partition    PB_PARTITION_STATIC: DistributedSampler semantics; every rank gets the
 *                same number of batches (drop_last drops the tail, else the last rank's
 *                share is padded by wrapping around). PB_PARTITION_DYNAMIC: a faster rank
 *                reads more; every record is read exactly once per epoch; drop_last drops
 *                each rank's final partial batch. Each dynamic loader claims through
 *                counters of its own, so loaders over the same data (open at once or one
 *                after another) each read everything; every rank must open its dynamic
 *                loaders in the same order.
 *   shuffle      1: shuffle the task order with the same permutation on every rank, from
 *                seed and the epoch; 0: file order.
 *   skip_corrupt 1: skip corrupt chunks and count them (pb_loader_corrupt_chunks) instead
 *                of failing; 0: fail with PB_ERR_CORRUPT.
 * The files' chunk headers are scanned here: a missing file gives PB_ERR_IO and a corrupt
 * header PB_ERR_CORRUPT, before any batch is read. The `files` array and its strings are
 * read during the call only. Errors: PB_ERR_INVALID_ARGUMENT for bad values or a dataset
 * without records; PB_ERR_CLOSED for a finalized group. */
int pb_loader_open(pb_group *group, const char *const *files, int32_t nfiles, int64_t batch_size,
                   int32_t partition, int32_t shuffle, int64_t seed, int32_t drop_last,
                   int32_t skip_corrupt, pb_loader **out);

/* Read the next batch of the current pass (epoch). On PB_OK, *has_batch is 1 and *data,
 * *offsets (*count + 1 entries, offsets[0] == 0) and *count describe the batch, or
 * *has_batch is 0 (and *count 0) when the pass has ended; the call after that starts the
 * next pass (call pb_loader_set_epoch before it). The memory belongs to the loader and is
 * read-only; it stays valid until the next pb_loader_next or pb_loader_close on this
 * loader: copy what must live longer. After an error the pass ends and the next call
 * starts a new one. A batch holds 1 to batch_size records: the last one of a pass may be
 * short, and with skip_corrupt so may those that lost a skipped chunk's records. Under
 * PB_PARTITION_DYNAMIC every rank must call until the end of each pass. *has_batch == 0
 * with PB_OK is the signal that this rank has no more batches this epoch: under
 * PB_PARTITION_DYNAMIC the ranks' batch counts differ, and a rank that runs out joins its
 * reducer (pb_reducer_join, with PB_REDUCER_JOIN) so the others finish without it. */
int pb_loader_next(pb_loader *loader, const uint8_t **data, const int64_t **offsets,
                   int64_t *count, int32_t *has_batch);

/* Set the epoch (>= 0) of the next pass: it changes the shuffle and keys the dynamic
 * partition's counters. Takes effect when the next pass starts. */
int pb_loader_set_epoch(pb_loader *loader, int64_t epoch);

/* The epoch of the current or next pass: the last pb_loader_set_epoch's, or the saved
 * epoch after pb_checkpoint_restore (continue the training loop from there). */
int pb_loader_epoch(pb_loader *loader, int64_t *out);

/* Batches prepared ahead on the loader's background thread (default 2; 0: each
 * pb_loader_next reads on the calling thread). Prefetching overlaps reading with the
 * caller's work; when the caller does little between batches on a machine with few cores,
 * 0 can be faster (see the README's RecordIO benchmark). Takes effect when the next pass
 * starts. Errors: PB_ERR_INVALID_ARGUMENT for a negative count. */
int pb_loader_set_prefetch(pb_loader *loader, int32_t batches);

/* Batches per pass on this rank: the same on every rank under PB_PARTITION_STATIC;
 * -1 under PB_PARTITION_DYNAMIC, where it depends on timing. */
int pb_loader_num_batches(pb_loader *loader, int64_t *out);

/* Records in the whole dataset (all files, all ranks). */
int pb_loader_num_records(pb_loader *loader, int64_t *out);

/* Corrupt chunks skipped so far (with skip_corrupt), over all files. */
int pb_loader_corrupt_chunks(pb_loader *loader, int64_t *out);

/* Stop prefetching, close the files and invalidate the last batch's pointers. Later
 * calls on the handle return PB_ERR_CLOSED; a second pb_loader_close is a no-op (PB_OK).
 *
 * Threads: a loader may be used from one thread at a time (pb_loader_next from another
 * thread would invalidate the pointers the first one holds); different loaders are
 * independent. */
int pb_loader_close(pb_loader *loader);

/* ---- Gradient reducer ------------------------------------------------------------ */
/* Bucketed, hook-driven gradient allreduce for programs that compute gradients
 * themselves. The library owns one flat buffer per bucket; each parameter's gradient
 * is a writable view into it. An iteration is:
 *
 *     for each gradient i, as the backward pass produces it:
 *         write it into the view of pb_reducer_grad(r, i)    (no copy into a bucket)
 *         pb_reducer_mark_ready(r, i)    the hook: once every gradient of i's bucket is
 *                                        marked, that bucket's allreduce starts, async
 *     pb_reducer_wait(r, timeout)        the views now hold the averaged (or summed)
 *                                        gradients; step the optimizer with them
 *
 * Gradients may be marked in any order; buckets are sent in bucket order on every rank,
 * so the collectives match across ranks. Every rank must mark the same gradients and
 * call pb_reducer_wait the same number of times. After the first pb_reducer_wait the
 * buckets are rebuilt once in the order gradients became ready on rank 0 (unless
 * PB_REDUCER_NO_REBUILD); when that order gives other buckets than the initial ones,
 * the views move and the generation counter goes up (otherwise nothing changes).
 *
 * Threads: the functions may be called from any thread. A reducer's state is guarded
 * by a lock, but which iteration a pb_reducer_mark_ready belongs to is the caller's
 * to order: do not mark gradients of the next iteration before pb_reducer_wait of the
 * current one has returned. Do not write a gradient's view after marking it ready
 * and before pb_reducer_wait returns (its allreduce may be reading or writing it). */

typedef struct pb_reducer pb_reducer; /* buckets, views and in-flight allreduces */

/* Flags (pb_reducer_options.flags; OR them together). */
#define PB_REDUCER_ALLOW_UNUSED 1 /* pb_reducer_wait accepts unmarked gradients and sends
                                     what their views hold (zero them for "no gradient") */
#define PB_REDUCER_NO_REBUILD 2   /* keep the initial bucket order (reverse parameter order) */
#define PB_REDUCER_JOIN 4         /* uneven inputs: each iteration starts with a count of the
                                     ranks still training, so a rank with no more batches can
                                     call pb_reducer_join (see there). Every rank sets it or none */
#define PB_REDUCER_JOIN_DIVIDE_BY_ACTIVE 8 /* with PB_REDUCER_JOIN and PB_AVG: average over the ranks
                                     still training, not the world size (torch Join's
                                     divide_by_initial_world_size=False) */
#define PB_REDUCER_BUCKET_VIEW 16 /* pb_reducer_attach only: each parameter's .grad becomes a view
                                     of its place in its bucket (torch DDP's
                                     gradient_as_bucket_view): backward writes the bucket, nothing
                                     is copied */

/* Communication hooks (pb_reducer_options.hook): how a full bucket travels. The reducer
 * keeps readiness, launch order and rebuilds; the hook is torch's DDP comm-hook contract. */
#define PB_HOOK_ALLREDUCE 0   /* sum over the group (divided first for PB_AVG) */
#define PB_HOOK_FP16 1        /* float32 buckets travel as half, decompressed in place */
#define PB_HOOK_BF16 2        /* float32 buckets travel as bfloat16 */
#define PB_HOOK_POWERSGD 3    /* torch's PowerSGD low-rank compression (averages) */
#define PB_HOOK_HIERARCHICAL 4 /* sum within the node, allreduce among node leaders (local
                                  rank 0), broadcast within the node: one bucket per node
                                  crosses node links (hook_ranks_per_node sets the node) */
#define PB_HOOK_NO_WARM_START 1 /* hook_flags: PowerSGD redraws Q every step */
#define PB_HOOK_WIRE_FP16 2     /* hook_flags: PB_HOOK_HIERARCHICAL sends float32 buckets as half */
#define PB_HOOK_WIRE_BF16 4     /* hook_flags: PB_HOOK_HIERARCHICAL sends float32 buckets as bfloat16 */

/* Gradient compression: another name for a hook (PB_COMPRESS_X == PB_HOOK_X, the same
 * reducer and the same cross-rank signature). float32 buckets travel as half or bfloat16
 * and are decompressed in place; other dtypes travel as they are. */
#define PB_COMPRESS_NONE 0
#define PB_COMPRESS_FP16 1
#define PB_COMPRESS_BF16 2

/* Gossip topologies (pb_reducer_options.gossip_topology). */
#define PB_GOSSIP_NONE -1         /* no gossip: buckets travel with the hook (the default) */
#define PB_GOSSIP_CUBE 0          /* partner i XOR 2^k: symmetric pairs; N a power of two mixes exactly */
#define PB_GOSSIP_DISSEMINATION 1 /* send to i + 2^k, receive from i - 2^k: every node, any N */

/* Every setting of a reducer, passed once to pb_reducer_create (as sqlite3_open_v2's
 * flags). Fill it with pb_reducer_options_init, then change what you need: a zeroed
 * struct is not the defaults (op 0 is PB_SUM, gossip_topology 0 is PB_GOSSIP_CUBE).
 *
 * The struct can grow: `size` is sizeof(pb_reducer_options) as the caller was compiled,
 * and fields that end past it take their defaults, so a program built against an older,
 * smaller struct keeps working. A size under 4 bytes, one that ends inside a field, or
 * one larger than this library knows with nonzero bytes past the known fields (settings
 * of a newer pybridge) is PB_ERR_INVALID_ARGUMENT naming `size`. Fields are only ever
 * appended. */
typedef struct pb_reducer_options {
    uint32_t size;               /* sizeof(pb_reducer_options): set by pb_reducer_options_init */
    int32_t op;                  /* PB_AVG (default: divide the sum by the world size) or PB_SUM */
    double bucket_cap_mb;        /* bytes per bucket in MiB; 0 (default): 25, with a 1 MiB first
                                    bucket so that the first allreduce starts early; a cap given
                                    here applies to the first bucket too (torch DDP's rule).
                                    Negative or NaN: PB_ERR_INVALID_ARGUMENT */
    double first_bucket_cap_mb;  /* the first bucket's cap in MiB; 0 (default): by the rule above */
    int32_t flags;               /* 0 or PB_REDUCER_* flags */
    int32_t hook;                /* PB_HOOK_* (default PB_HOOK_ALLREDUCE); PB_COMPRESS_* alike */
    int32_t hook_rank;           /* PB_HOOK_POWERSGD: the matrix approximation rank, >= 1
                                    (default 1; 1 to 4 are typical); other hooks ignore it */
    int32_t hook_flags;          /* 0, PB_HOOK_NO_WARM_START (PowerSGD), or one of
                                    PB_HOOK_WIRE_FP16 / PB_HOOK_WIRE_BF16 (PB_HOOK_HIERARCHICAL) */
    int32_t gossip_topology;     /* PB_GOSSIP_NONE (default), PB_GOSSIP_CUBE or
                                    PB_GOSSIP_DISSEMINATION: see "Gossip" below. Gossip takes the
                                    hook's place: hook must then stay PB_HOOK_ALLREDUCE */
    int32_t gossip_ranks_per_node; /* ranks per node, dividing the world size; 0 (default): the
                                      launcher's (LOCAL_WORLD_SIZE), or 1 without a launcher */
    int64_t gossip_seed;         /* >= 0: draws the rotating partners (default 0) */
    int32_t gossip_sync_every;   /* >= 0: every K-th step is an exact average (default 0: never) */
    int32_t hook_start_iter;     /* PB_HOOK_POWERSGD: iterations of plain allreduce before
                                    compression starts (torch's start_powerSGD_iter), >= 2
                                    (default 2) */
    const int32_t *ndims;        /* NULL (default): flat gradients. Else gradient i has ndims[i]
                                    dimensions (0: flat), read in turn from dims (row-major, same
                                    element count as counts[i]); hooks that compress matrices
                                    (PB_HOOK_POWERSGD) need them. Read during the call only */
    const int64_t *dims;
    int32_t hook_ranks_per_node; /* PB_HOOK_HIERARCHICAL: ranks per node (consecutive ranks),
                                    dividing the group size; 0 (default): the launcher's
                                    LOCAL_WORLD_SIZE (the whole group when it is unset) */
    const char *hook_name;       /* NULL (default): `hook` chooses. Else the hook of that name:
                                    a built-in's (its PB_HOOK_ code in lower case: "fp16" is
                                    PB_HOOK_FP16; the hook_* settings above apply) or one a
                                    module registered (pb_import_module), which takes no
                                    settings; `hook` and gossip_topology then stay at their
                                    defaults. An unknown name is PB_ERR_INVALID_ARGUMENT
                                    listing every name. Read during the call only */
} pb_reducer_options;

/* Fill *options with the defaults above (size included). Sets every field. */
static inline void pb_reducer_options_init(pb_reducer_options *options) {
    options->size = (uint32_t)sizeof(pb_reducer_options);
    options->op = PB_AVG;
    options->bucket_cap_mb = 0;
    options->first_bucket_cap_mb = 0;
    options->flags = 0;
    options->hook = PB_HOOK_ALLREDUCE;
    options->hook_rank = 1;
    options->hook_flags = 0;
    options->gossip_topology = PB_GOSSIP_NONE;
    options->gossip_ranks_per_node = 0;
    options->gossip_seed = 0;
    options->gossip_sync_every = 0;
    options->hook_start_iter = 2;
    options->ndims = 0;
    options->dims = 0;
    options->hook_ranks_per_node = 0;
    options->hook_name = 0;
}

/* Create a reducer over `nparams` gradients, configured by `options` (NULL: the
 * defaults): gradient i has counts[i] elements of floating-point type dtypes[i]
 * (PB_FLOAT32, PB_FLOAT64, PB_FLOAT16 or PB_BFLOAT16). The buckets live on the group's
 * device (pb_device: host memory under gloo). The arrays and *options are read during
 * the call only. Views start zeroed. Release with pb_reducer_close.
 *
 * COLLECTIVE: every rank creates its reducers in the same order with the same counts,
 * dtypes, shapes and options. One small allgather compares them all (parameters, op,
 * caps, flags, hook and its settings, gossip settings): when they differ, every rank gets
 * PB_ERR_INVALID_ARGUMENT naming the settings that differ and each rank's value (e.g. a
 * PowerSGD rank beside a PB_HOOK_FP16 one), without checked mode. With gossip or
 * PB_HOOK_HIERARCHICAL the call then creates the node groups (a collective over the group).
 *
 * Errors: PB_ERR_INVALID_ARGUMENT (NULL arrays with nparams > 0, negative counts,
 * non-float or unknown dtypes, shapes whose element count differs, a bad options size,
 * unknown op, hook, flags or topology, a bad cap, PowerSGD rank or gossip value, gossip
 * with a hook other than PB_HOOK_ALLREDUCE, settings that differ across ranks),
 * PB_ERR_NOT_INITIALIZED / PB_ERR_CLOSED for the group, PB_ERR_TIMEOUT. */
int pb_reducer_create(pb_group *group, int32_t nparams, const int64_t *counts,
                      const int32_t *dtypes, const pb_reducer_options *options, pb_reducer **out);

/* Deprecated: use pb_reducer_create. The same reducer as pb_reducer_create with options
 * op, flags, hook = compression (PB_COMPRESS_*) and bucket_cap_mb, where any
 * bucket_cap_mb <= 0 means the default (pb_reducer_create refuses a negative cap). */
int pb_reducer_new(pb_group *group, int32_t nparams, const int64_t *counts,
                   const int32_t *dtypes, double bucket_cap_mb, int32_t op,
                   int32_t compression, int32_t flags, pb_reducer **out);

/* Describe gradient `index`'s view (0 <= index < nparams) in *out: library-owned memory
 * the caller may write (before marking the gradient ready) and read (after
 * pb_reducer_wait). The pointer is valid until the generation changes (see
 * pb_reducer_generation) or the reducer is freed; memory of an older generation stays
 * allocated until pb_reducer_close, so a stale pointer is never a dangling one, but
 * what is written there is no longer reduced. */
int pb_reducer_grad(pb_reducer *reducer, int32_t index, pb_tensor *out);

/* Describe all gradients' views at once: out has room for n descriptors, n == nparams. */
int pb_reducer_grads(pb_reducer *reducer, int32_t n, pb_tensor *out);

/* The layout generation in *out: 0 at creation, +1 when the first pb_reducer_wait
 * rebuilt the buckets into another layout (at most once; the same buckets keep 0).
 * When it changes, fetch the views again; the gradient values were carried over. */
int pb_reducer_generation(pb_reducer *reducer, int64_t *out);

/* Gradient `index` is written for this iteration: the hook. When it completes its
 * bucket (and every earlier bucket has started), the bucket's allreduce starts and
 * the call returns without waiting for it.
 * Errors: PB_ERR_INVALID_ARGUMENT for an index out of range or a gradient already
 * marked in this iteration (or a freed reducer handle). */
int pb_reducer_mark_ready(pb_reducer *reducer, int32_t index);

/* Wait for every bucket's allreduce of this iteration; on PB_OK the views hold the
 * reduced gradients and the next pb_reducer_mark_ready starts a new iteration.
 * timeout_seconds <= 0 waits up to the group's timeout.
 * Errors: PB_ERR_INVALID_ARGUMENT when gradients were not marked (the message lists
 * their indices and this rank, "Parameter indices which did not receive grad for rank
 * R: 0 2.", as torch DDP's error does; the iteration is abandoned and the next one
 * starts); PB_ERR_TIMEOUT or PB_ERR_COMM when the reduction fails. */
int pb_reducer_wait(pb_reducer *reducer, double timeout_seconds);

/* pb_reducer_wait for at most timeout_seconds (0: only look) that does not give the
 * iteration up when that time passes: *done = 1 when the gradients are reduced (the
 * iteration is then over, as after pb_reducer_wait), 0 while buckets are still in flight;
 * they go on: poll again or call pb_reducer_wait later, and mark no more gradients of this
 * iteration. (A timeout of pb_reducer_wait gives the iteration up, PB_ERR_TIMEOUT.) For
 * callers that stop waiting on their own terms, as Go's Reducer.WaitContext.
 * Errors: as pb_reducer_wait (the iteration is then over); PB_ERR_INVALID_ARGUMENT for a
 * negative or NaN timeout or a NULL done. */
int pb_reducer_poll(pb_reducer *reducer, double timeout_seconds, int32_t *done);

/* Deprecated: use pb_reducer_options.hook, hook_rank and hook_flags. Chooses how buckets
 * travel after creation, between iterations (as torch's register_comm_hook); replaces the
 * hook or gossip chosen before. hook: PB_HOOK_*; `rank` as hook_rank (other hooks ignore
 * it); flags: 0 or PB_HOOK_NO_WARM_START. Every rank must pick the same hook: the ranks
 * compare their settings at the first pb_reducer_mark_ready or pb_reducer_wait after the
 * call (every rank gets PB_ERR_INVALID_ARGUMENT there when they differ).
 * Errors: PB_ERR_INVALID_ARGUMENT for an unknown hook, a bad rank, or a call after the
 * first mark of an iteration. */
int pb_reducer_set_hook(pb_reducer *reducer, int32_t hook, int32_t rank, int32_t flags);

/* Gossip: communicate buckets with GossipGraD instead of an allreduce. Each node
 * (ranks_per_node consecutive ranks; 1 for one rank per node; 0 the launcher's
 * LOCAL_WORLD_SIZE, or 1 without a launcher) averages within itself,
 * then exchanges with one partner node per step (topology PB_GOSSIP_*, partners rotating
 * every ceil(log2 nodes) steps, drawn from `seed`), then shares the result in the node.
 * One bucket-sized message per node per step, whatever the world size; replicas are no
 * longer exactly equal. sync_every = K > 0 makes every K-th step an exact average of the
 * gradients; the caller averages its own parameters there (e.g. pb_all_reduce with
 * PB_AVG) to bring the replicas together.
 *
 * Deprecated: use pb_reducer_options.gossip_*. Sets gossip after creation, between
 * iterations; COLLECTIVE over the reducer's group (it creates the node groups). Replaces
 * any hook set before; the ranks compare settings as after pb_reducer_set_hook. */
int pb_reducer_set_gossip(pb_reducer *reducer, int32_t topology, int32_t ranks_per_node,
                          int64_t seed, int32_t sync_every);

/* Deprecated: use pb_reducer_options.ndims and dims. Gives the gradients shapes after
 * creation, between iterations, as those fields do: gradient i has ndims[i] dimensions
 * (0 keeps it flat), read in turn from `dims`. Views keep their memory. The ranks compare
 * shapes as after pb_reducer_set_hook.
 * Errors: PB_ERR_INVALID_ARGUMENT when a shape's element count differs, or NULL arrays. */
int pb_reducer_set_shapes(pb_reducer *reducer, int32_t nparams, const int32_t *ndims,
                          const int64_t *dims);

/* Set every gradient view to zero (for callers that accumulate into the views). */
int pb_reducer_zero(pb_reducer *reducer);

/* Reduce the caller's own gradient memory (torch DDP's default mode, for programs whose
 * gradients live in their tensor library): from now on pb_reducer_mark_ready(r, i) first
 * copies grads[i] into gradient i's place in its bucket, and pb_reducer_wait copies the
 * reduced gradients back into grads. n == nparams descriptors (read during the call), one
 * per gradient, of its element count and dtype, on the buckets' device; the memory they
 * describe is kept and used until the next pb_reducer_bind_grads or pb_reducer_close:
 * keep it valid. n == 0 (grads may be NULL) unbinds. Between iterations.
 * (The other mode, no copy: make the program's gradients views of pb_reducer_grad.)
 * Errors: PB_ERR_INVALID_ARGUMENT naming the gradient whose count, dtype or device
 * differs, a count n other than 0 or nparams, or a call during an iteration. */
int pb_reducer_bind_grads(pb_reducer *reducer, int32_t n, const pb_tensor *grads);

/* Uneven inputs (torch's Join): this rank has no more batches (pb_loader_next said
 * *has_batch == 0). Until every rank has joined, shadow the iterations of the ranks still
 * training: take part in each of their collectives with zero gradients, so none of them
 * waits for this rank. Every rank calls it once at the end of each epoch (the last to run
 * out return at once); afterwards the reducer is ready for the next epoch. The ranks still
 * training averaged over the world size (or, with PB_REDUCER_JOIN_DIVIDE_BY_ACTIVE, over
 * the ranks still training), and only they stepped: take the parameters of rank *root (the
 * largest of those that joined last) on every rank, e.g. pb_broadcast_params(group, n,
 * params, *root), as torch's join does. *shadowed gets the iterations this rank shadowed.
 * Either out-pointer may be NULL. The views of this rank keep their values.
 * COLLECTIVE over the reducer's group, between iterations; the reducer must have been
 * created with PB_REDUCER_JOIN on every rank. Collectives the program issues itself inside
 * an iteration (other than the reducer's) are not shadowed: issue them after the join.
 * Errors: PB_ERR_INVALID_ARGUMENT (a reducer without PB_REDUCER_JOIN, gradients already
 * marked in this iteration), PB_ERR_TIMEOUT or PB_ERR_COMM. */
int pb_reducer_join(pb_reducer *reducer, int32_t *root, int64_t *shadowed);

/* Attach a reducer to a libtorch model's parameters, in one call: params[i] names
 * parameter i by handle (dtype PB_TORCH_TENSOR), a leaf tensor that requires grad, of a
 * floating-point dtype, on the group's device. The reducer registers a post-accumulate-grad
 * hook on each parameter (as torch DDP's reducer does), so libtorch's own backward marks
 * each gradient ready the moment it is complete and its bucket's allreduce overlaps the
 * rest of backward, with no callback into the caller's language; when backward ends, the
 * reduction is finished and each parameter's .grad holds the average (or sum) over ranks.
 * No pb_reducer_mark_ready, pb_reducer_wait or pb_reducer_bind_grads is called.
 * Modes, as torch DDP's: by default .grad stays the program's own tensor, copied into the
 * bucket and back (nothing to rebind after the optimizer's zero_grad sets it to None);
 * with PB_REDUCER_BUCKET_VIEW in options->flags each .grad becomes a view of the bucket, and
 * is made one again when the optimizer set it to None or the buckets were rebuilt.
 * Every other setting of *options applies (hooks, gossip, join, caps). Call
 * pb_reducer_wait(reducer, 0) after each backward: PB_OK at once, or the status of a
 * reduction that failed (PB_ERR_TIMEOUT, PB_ERR_COMM, PB_ERR_MEMBERSHIP: a peer lost in an
 * elastic world, then pb_state_reset). A bucket that cannot start fails backward itself
 * (libtorch throws, with pybridge's message); a failure seen when backward ends does not
 * throw (Python's error state would be left on the calling thread) but is kept: a program
 * that does not ask has its next backward fail with it. pb_reducer_join, pb_reducer_grad, pb_state_* and the
 * elastic reset work as for pb_reducer_create; pb_reducer_close removes the hooks and gives
 * each parameter a .grad of its own. The reducer holds references to the parameters.
 * COLLECTIVE, as pb_reducer_create (the ranks compare parameters and settings).
 * Errors: PB_ERR_INVALID_ARGUMENT (a descriptor that is not a PB_TORCH_TENSOR handle or is
 * refused as such, a parameter that is not a leaf or does not require grad, or whose dtype
 * is not floating point, PB_REDUCER_BUCKET_VIEW on pb_reducer_create, and what
 * pb_reducer_create refuses). */
int pb_reducer_attach(pb_group *group, int32_t n, const pb_tensor *params,
                      const pb_reducer_options *options, pb_reducer **out);

/* Release the reducer, its buckets and its hook's state (gossip: its thread and node
 * groups). Pointers from pb_reducer_grad must not be used afterwards. Waits for nothing:
 * call pb_reducer_wait first if buckets are in flight. Later calls on the handle, a
 * second pb_reducer_close included, return PB_ERR_INVALID_ARGUMENT. */
int pb_reducer_close(pb_reducer *reducer);

/* Deprecated: use pb_reducer_close (the same call; every destructor is named _close). */
int pb_reducer_free(pb_reducer *reducer);

/* Copy `n` tensors from rank `root` to every rank, in place (e.g. initial parameters),
 * coalesced into a few broadcasts per dtype. Synchronous: `tensors` (an array of n
 * descriptors) and their memory are used during the call only. COLLECTIVE: every rank
 * passes the same counts and dtypes in the same order and the same root; when they
 * differ, every rank gets PB_ERR_INVALID_ARGUMENT (one small allgather checks it). */
int pb_broadcast_params(pb_group *group, int32_t n, const pb_tensor *tensors, int32_t root);

/* ---- Model averaging (local SGD) ------------------------------------------------ */
/* For links too slow to reduce gradients every step: each rank steps its own parameters
 * and, every `period` steps, the parameters are averaged over the group (torch's
 * PeriodicModelAverager; docs/local-sgd.md). Post-local SGD: reduce gradients with a
 * pb_reducer for the first `warmup_steps` steps, then stop calling it and let the averager
 * bring the replicas together. Parameters are floating point, in host memory under gloo. */

typedef struct pb_averager pb_averager; /* a step counter and its schedule */

/* Average the `n` tensors over `group`, in place, now: one allreduce of the tensors
 * flattened into one buffer (of their common promoted type), divided by the group size
 * first, as torch's model averaging does. Synchronous; the descriptors and memory are used
 * during the call only. COLLECTIVE: every rank passes the same counts and dtypes in order.
 * Errors: PB_ERR_INVALID_ARGUMENT (NULL tensors with n > 0, a non-float dtype),
 * PB_ERR_NOT_INITIALIZED / PB_ERR_CLOSED for the group, PB_ERR_TIMEOUT, PB_ERR_COMM. */
int pb_average_params(pb_group *group, int32_t n, const pb_tensor *tensors);

/* An averager over `group`: pb_averager_step averages when step >= warmup_steps and
 * (step - warmup_steps) is a multiple of `period` (>= 1), then counts the step. Not a
 * collective (the schedule is local; the averaging steps are). Release with
 * pb_averager_close. Errors: PB_ERR_INVALID_ARGUMENT (period < 1, warmup_steps < 0, NULL
 * out), PB_ERR_NOT_INITIALIZED / PB_ERR_CLOSED for the group. */
int pb_averager_create(pb_group *group, int32_t period, int32_t warmup_steps, pb_averager **out);

/* A hierarchical averager (torch's HierarchicalModelAverager): level i averages over
 * consecutive blocks of group_sizes[i] ranks every periods[i] steps; periods increase and
 * the last group size is the whole group's. After the warm-up, a step averages at the
 * level of the largest period that divides the step (counted from 0, warm-up included).
 * E.g. periods {4, 16}, group sizes {ranks per node, world}: within the node every 4
 * steps, across nodes every 16. COLLECTIVE over `group` (it creates the subgroups).
 * Errors: PB_ERR_INVALID_ARGUMENT (nlevels < 1, NULL arrays, periods not increasing, a
 * size not dividing the group size, the last size not the group's). */
int pb_averager_create_hierarchical(pb_group *group, int32_t nlevels, const int32_t *periods,
                                    const int32_t *group_sizes, int32_t warmup_steps,
                                    pb_averager **out);

/* One training step, after the optimizer's update: average the `n` tensors if this step
 * is due (a collective then: every rank calls pb_averager_step the same number of times
 * with the same counts and dtypes), then count the step. *averaged (may be NULL) receives
 * 1 if it averaged, else 0. Errors: those of pb_average_params. */
int pb_averager_step(pb_averager *averager, int32_t n, const pb_tensor *tensors,
                     int32_t *averaged);

/* The steps counted so far (to save in a checkpoint) in *out. */
int pb_averager_get_step(pb_averager *averager, int64_t *out);

/* Continue the schedule at `step` (>= 0), as after a restart from a checkpoint. */
int pb_averager_set_step(pb_averager *averager, int64_t step);

/* Release the averager (and a hierarchical one's subgroups). Later calls on the handle, a
 * second pb_averager_close included, return PB_ERR_INVALID_ARGUMENT. */
int pb_averager_close(pb_averager *averager);

/* ---- DiLoCo and Streaming DiLoCo ------------------------------------------------- */
/* Training across slow links (docs/diloco.md): each rank steps its own replica with its own
 * inner optimizer and calls pb_diloco_step after each inner step. Every sync_every (H)
 * steps a fragment of the model syncs: its pseudo-gradient (its weights at the last sync
 * minus its weights now) is averaged over the group, sent as pb_diloco_options.quantization
 * says, and an outer optimizer (SGD, Nesterov momentum by default: lr 0.7, momentum 0.9, the
 * paper's) steps the last-sync weights with it; those become the fragment's weights on
 * every rank, mixed with the local ones by alpha. Streaming DiLoCo: fragments > 1 sync in
 * turn, one every H / fragments steps, each overlapping the `delay` (tau) inner steps after
 * it. The schedule, the average and the outer step are pybridge.algorithms.diloco's, the
 * same for Python, C and Go. Parameters are floating point, in host memory under gloo. */

typedef struct pb_diloco pb_diloco; /* the last-sync weights, outer optimizers, the schedule */

/* How pseudo-gradients travel (pb_diloco_options.quantization): an all_to_all of each rank's
 * chunks, a float32 sum per chunk owner, an all_gather of the means (docs/diloco.md). */
#define PB_QUANT_FP32 0 /* exact: 4 bytes an element */
#define PB_QUANT_BF16 1 /* 2 bytes an element */
#define PB_QUANT_FP8 2  /* e4m3 with a float32 scale per block: 1 byte + 4/block_size */
#define PB_QUANT_INT8 3 /* symmetric, a scale per block: 1 byte + 4/block_size */
#define PB_QUANT_INT4 4 /* symmetric, a scale per block, two a byte: 1/2 byte + 4/block_size */

/* A DiLoCo's settings besides sync_every. Fill it with pb_diloco_options_init, then change
 * what you need. Size-prefixed as pb_reducer_options: fields past the caller's `size` take
 * their defaults; fields are only ever appended. */
typedef struct pb_diloco_options {
    uint32_t size;               /* sizeof(pb_diloco_options): set by pb_diloco_options_init */
    int32_t fragments;           /* F >= 1 (default 1: plain DiLoCo), at most the tensor count, dividing
                                    sync_every: the tensors, in order, cut into F runs of about
                                    equal size; one syncs every sync_every / F steps */
    int32_t delay;               /* tau, the inner steps a sync overlaps: 0 <= tau < sync_every / F
                                    (default 0) */
    double alpha;                /* in [0, 1] (default 0): after a sync a fragment's weights are
                                    (1 - alpha) global + alpha local */
    double outer_lr;             /* the outer SGD's learning rate, > 0 (default 0.7) */
    double outer_momentum;       /* its momentum in [0, 1) (default 0.9) */
    int32_t outer_nesterov;      /* 1 (default): Nesterov momentum (needs outer_momentum > 0); 0: plain */
    int32_t quantization;        /* PB_QUANT_* (default PB_QUANT_FP32) */
    int32_t block_size;          /* elements per scale of PB_QUANT_FP8, INT8 and INT4, >= 1 (default 128) */
    int32_t error_feedback;      /* 1: keep what each rank's quantization lost and add it to its next
                                    pseudo-gradient of that fragment (a lossy quantization only);
                                    0 (default): no */
} pb_diloco_options;

/* Fill *options with the defaults above (size included). Sets every field. */
static inline void pb_diloco_options_init(pb_diloco_options *options) {
    options->size = (uint32_t)sizeof(pb_diloco_options);
    options->fragments = 1;
    options->delay = 0;
    options->alpha = 0;
    options->outer_lr = 0.7;
    options->outer_momentum = 0.9;
    options->outer_nesterov = 1;
    options->quantization = PB_QUANT_FP32;
    options->block_size = 128;
    options->error_feedback = 0;
}

/* A DiLoCo over `group` for the model's `n` tensors `params` (floating point; raw memory or
 * PB_TORCH_TENSOR handles), read during the call only: their values become the first
 * last-sync weights and must be equal on every rank (broadcast them first, e.g.
 * pb_broadcast_params). sync_every: H >= 1, inner steps between two syncs of a fragment;
 * options: NULL for the defaults. Release with pb_diloco_close.
 * COLLECTIVE: every rank creates it with the same tensor counts, dtypes, settings and
 * weights; one small allgather compares them, and where they differ every rank gets
 * PB_ERR_INVALID_ARGUMENT naming what differs. With delay > 0 it also makes the group its
 * sync thread uses (a collective over `group`).
 * Errors: PB_ERR_INVALID_ARGUMENT naming the bad value (NULL params with n > 0, n < 1, a
 * non-float tensor, sync_every < 1, fragments < 1 or more than n or not dividing sync_every,
 * delay out of range, alpha outside [0, 1], outer_lr <= 0, outer_momentum outside [0, 1),
 * outer_nesterov with momentum 0, an unknown quantization, block_size < 1, error_feedback
 * with PB_QUANT_FP32, a flag other than 0 or 1, a bad options size, settings or weights
 * that differ across ranks), PB_ERR_NOT_INITIALIZED / PB_ERR_CLOSED for the group,
 * PB_ERR_TIMEOUT, PB_ERR_COMM. */
int pb_diloco_create(pb_group *group, int32_t n, const pb_tensor *params, int32_t sync_every,
                     const pb_diloco_options *options, pb_diloco **out);

/* One inner step, after the inner optimizer's update of `params` (the same n tensors, in the
 * order and of the sizes given at creation; read and written during the call only): count it,
 * then start, finish and apply the syncs the schedule puts here (writing the synced fragment's
 * weights into params). *synced (may be NULL) receives 1 when a sync was applied, else 0.
 * COLLECTIVE at sync steps: every rank calls pb_diloco_step the same number of times. With
 * delay > 0 a sync travels on the DiLoCo's own thread and group while the next inner steps run.
 * Errors: PB_ERR_INVALID_ARGUMENT (another count or size of tensors, NULL params),
 * PB_ERR_TIMEOUT, PB_ERR_COMM (a sync failed; nothing was applied), PB_ERR_CANCELED. */
int pb_diloco_step(pb_diloco *diloco, int32_t n, const pb_tensor *params, int32_t *synced);

/* What the DiLoCo did so far: inner steps counted, syncs applied and the bytes this rank
 * sent for them. Any out-pointer may be NULL. */
int pb_diloco_counts(pb_diloco *diloco, int64_t *steps, int64_t *syncs, int64_t *bytes_sent);

/* Release the DiLoCo: stop its sync thread and free its group (a sync under way is dropped).
 * Later calls on the handle, a second pb_diloco_close included, return
 * PB_ERR_INVALID_ARGUMENT. */
int pb_diloco_close(pb_diloco *diloco);

/* ---- Training state (checkpoints) ---------------------------------------------- */
/* A checkpoint is one file, directory/step-NNNNNNNNNNNN.pt (the step in 12 digits; format:
 * docs/checkpoint.md, readable by pybridge.runtime.checkpoint in Python), written atomically: a
 * temporary file in the same folder, fsync, rename. It holds named flat tensors (the
 * caller's parameters, optimizer state...), a loader's position and a reducer's counters. */

/* Save step `step` (>= 0) in `directory` (created if missing): the `n` tensors (names[i]
 * a distinct non-empty name for tensors[i]; host or CUDA memory, read during the call only),
 * the position of `loader` (PB_PARTITION_STATIC only; NULL: none) and the counters of
 * `reducer` (NULL: none); then delete all but the newest `keep` checkpoints there (0 keeps
 * all). Local, not a collective: call it on the ranks that should write (rank 0 for a shared
 * folder, or every rank with a folder each). Call it after the step that used the batches
 * the loader handed out. Errors: PB_ERR_INVALID_ARGUMENT (NULL, empty or repeated names, a
 * dynamic loader, a negative step or keep), PB_ERR_IO (the folder or file could not be
 * written; the previous checkpoints are intact). */
int pb_checkpoint_save(const char *directory, int64_t step, int32_t n, const char *const *names,
                       const pb_tensor *tensors, pb_loader *loader, pb_reducer *reducer,
                       int32_t keep);

/* Restore the newest checkpoint any rank holds. COLLECTIVE over `group` (NULL: this process
 * alone): each rank looks in its own `directory`; the ranks agree on the newest step, and
 * the lowest rank holding it sends its file to the others. Every rank then copies the saved
 * tensors into `tensors` (the same names, counts and dtypes as saved, checked before
 * anything is written), continues `loader` where the saved run stopped (the rest of the
 * saved epoch, shared over this group's ranks, however many: the world size may differ from
 * the run that saved it) and restores the reducer's counters. *step receives the saved step,
 * or -1 when no rank holds a checkpoint (nothing is changed). Errors:
 * PB_ERR_INVALID_ARGUMENT (names, counts or dtypes differ from the checkpoint's, or the
 * loader's dataset or order does), PB_ERR_IO (the file could not be read), PB_ERR_CORRUPT
 * (not a pybridge checkpoint), PB_ERR_TIMEOUT / PB_ERR_COMM (a peer failed). */
int pb_checkpoint_restore(pb_group *group, const char *directory, int32_t n,
                          const char *const *names, const pb_tensor *tensors, pb_loader *loader,
                          pb_reducer *reducer, int64_t *step);

/* ---- Preemption ---------------------------------------------------------------- */
/* A scheduler warns before it kills (SLURM: SIGUSR1 with --signal=USR1@120, or SIGTERM);
 * the signal reaches ranks at different moments, or only some of them. The program
 * catches it (sigaction) and asks every step whether any rank saw it; all ranks then stop
 * after the same step, save a checkpoint and exit with PB_EXIT_REQUEUE, which the job
 * script (or pybridge-launch) turns into a requeue (docs/checkpoint.md, "Preemption"). */
#define PB_EXIT_REQUEUE 75 /* EX_TEMPFAIL: the job saved its state and wants to run again */

/* *any receives 1 on every rank if `flag` is non-zero on any of them, else 0. COLLECTIVE
 * over `group` (one allreduce of one integer): every member calls it at the same point. */
int pb_any_rank(pb_group *group, int32_t flag, int32_t *any);

/* ---- Elastic state: commit and roll back in memory ------------------------------- */
/* The training state of a checkpoint (named flat tensors, a loader's position, a reducer's
 * counters) kept in this process's memory instead of a file: pb_state_commit copies it in,
 * pb_state_restore copies the last commit back (rolling back the steps since), and
 * pb_state_sync sends one rank's last commit to every rank over the network (what a rank
 * joining a running job needs). Every call reads or writes the tensors it is given during
 * the call only (names, counts and dtypes as committed, checked before anything is
 * written). docs/elastic.md: this is the first part of elastic training. */
typedef struct pb_state pb_state;

/* A state with nothing committed yet. Close it with pb_state_close. */
int pb_state_create(pb_state **out);

/* Commit step `step` (>= 0): copies of the n tensors, the loader's position (NULL: none)
 * and the reducer's counters (NULL: none), replacing the previous commit. Local, except in
 * an elastic world (pb_elastic_init), where it is a COLLECTIVE (call it at the same step on
 * every rank): after the copy, rank 0 tells every rank whether processes wait to join, and
 * if so every rank returns PB_ERR_MEMBERSHIP (the commit is made: pb_state_reset rolls
 * back to it, losing no step, and sends it to the joiners). */
int pb_state_commit(pb_state *state, int64_t step, int32_t n, const char *const *names,
                    const pb_tensor *tensors, pb_loader *loader, pb_reducer *reducer);

/* Roll back: the last commit's values into the tensors, the loader and the reducer; *step
 * receives the committed step. PB_ERR_INVALID_ARGUMENT when nothing was committed or the
 * names, counts or dtypes differ from the commit's. */
int pb_state_restore(pb_state *state, int32_t n, const char *const *names, const pb_tensor *tensors,
                     pb_loader *loader, pb_reducer *reducer, int64_t *step);

/* COLLECTIVE over `group`: every rank takes rank `root`'s last commit as its own and
 * restores it as pb_state_restore does (the root included). A root that has committed
 * nothing yet sends what its tensors, loader and reducer hold now, as step 0: so the first
 * world of an elastic job starts from rank 0's values, and a joiner (which must not commit
 * before it has the state) receives the live commit, by the same call. */
int pb_state_sync(pb_state *state, pb_group *group, int32_t root, int32_t n, const char *const *names,
                  const pb_tensor *tensors, pb_loader *loader, pb_reducer *reducer, int64_t *step);

int pb_state_close(pb_state *state);

/* ---- Elastic training: the survivors go on ------------------------------------------ */
/* docs/elastic.md. Run the program under `pybridge-launch --elastic`: a worker's death does
 * not stop the others. When a peer dies or stops answering (lost after the timeout), or
 * processes wait to join at a commit, every rank's current call returns PB_ERR_MEMBERSHIP
 * (its message names the lost ranks, their hosts and pids) and pb_state_reset moves onto
 * the new world (CONVENTIONS, Elastic, has the loop). Rolled back: the tensors, loader and
 * reducer given to pb_state_reset, to the last pb_state_commit. Not survived: the death of
 * node 0's launcher, which hosts the store. */

/* Join an elastic job; *out receives the world group, a pb_group like pb_init's (every
 * function taking a group takes it). Its size is the launcher's first world (WORLD_SIZE);
 * a process started later (a replacement) joins the running job at its next commit.
 *   backend      as pb_init's (NULL or "": "auto").
 *   store_addr   "host:port" of the job's store; NULL or "": MASTER_ADDR:MASTER_PORT as
 *                pybridge-launch --elastic sets them (its node 0 launcher hosts it).
 *   timeout_seconds
 *                bounds every collective: a peer that stops answering is lost after it;
 *                <= 0 reads PYBRIDGE_TIMEOUT, else 300 s.
 * Settings from the launcher's environment: PYBRIDGE_ELASTIC_MIN / _MAX (world sizes),
 * PYBRIDGE_ELASTIC_LOST_AFTER (seconds without a heartbeat, default 10).
 * Errors: PB_ERR_INVALID_ARGUMENT (no store address, a bad one, NaN timeout),
 * PB_ERR_ALREADY_INITIALIZED (a world is live), PB_ERR_TIMEOUT (the store does not answer,
 * or the world did not form). Leave with pb_finalize on the newest world handle. */
int pb_elastic_init(const char *backend, const char *store_addr, double timeout_seconds, pb_group **out);

/* After PB_ERR_MEMBERSHIP: move onto the agreed world and roll back. COLLECTIVE on the new
 * world. The reducer and loader (either may be NULL) are re-bound to the new world (the
 * loader's epoch continues from the committed position, its unread records re-shared over
 * the new ranks); every rank rolls back to its last commit and takes the new rank 0's (the
 * lowest surviving old rank's) committed state, as pb_state_sync does; the tensors, names,
 * counts and dtypes are as committed (a state with no commit yet, say a change during
 * the first pb_state_sync, counts what it holds now as step 0). *group receives the new world's handle: the old one,
 * and its subgroups, now return PB_ERR_CLOSED (pb_finalize on it is a no-op). *step
 * receives the committed step. The reducer's gradient buckets may be laid out anew: fetch
 * the pointers again (pb_reducer_grad); memory of old layouts stays valid until
 * pb_reducer_close. Errors: PB_ERR_MEMBERSHIP (the world changed again during the reset:
 * call it again), PB_ERR_INVALID_ARGUMENT (not an elastic job, no change to reset after:
 * the world stays live; NULL group or step, tensors unlike the commit's). */
int pb_state_reset(pb_state *state, int32_t n, const char *const *names, const pb_tensor *tensors,
                   pb_loader *loader, pb_reducer *reducer, pb_group **group, int64_t *step);

/* The training on the elastic world `group` finished (call it once the loop above returned
 * PB_OK, before pb_finalize): a process that comes later finds no world to join, and the
 * launcher starts no replacement (pybridge.runtime.elastic.run does the same). Errors:
 * PB_ERR_INVALID_ARGUMENT (not an elastic world), PB_ERR_CLOSED (an old world). */
int pb_elastic_finish(pb_group *group);

/* The latest change this process reset after (pb_state_reset): *n_lost receives how many
 * ranks of the old world were lost and the first `cap` of them, in the old world's
 * numbering, go into lost (NULL with cap 0 to count only); *joined how many processes
 * joined; *old_size and *new_size the world sizes; *generation the new world's number
 * (the first world is 1). Before any reset: nothing lost or joined, both sizes the current
 * world's. Any out-pointer may be NULL. The lost ranks' hosts and pids are named in the
 * PB_ERR_MEMBERSHIP message. Errors: PB_ERR_INVALID_ARGUMENT (not an elastic job, cap < 0,
 * lost NULL with cap > 0). */
int pb_elastic_last_change(int32_t *lost, int32_t cap, int32_t *n_lost, int32_t *joined,
                           int32_t *old_size, int32_t *new_size, int64_t *generation);

/* ---- Federated training ---------------------------------------------------------- */
/* FLUTE-style federated learning with asynchronous client assignment (docs/federated.md):
 * rank 0 of a group is the server, every other rank a worker that holds the clients' data.
 * Each round the server sends the model to the workers and hands out client ids; a worker
 * trains one client at a time on the round's model and returns its weights; a worker that
 * returns a result gets its next client at once. The server pulls results in completion
 * order and aggregates them with FedAvg. Both sides are pull APIs: no callbacks.
 * Creating a server and its workers is COLLECTIVE over the group (rank 0 creates the
 * server, every other rank one worker, in the same order as other collectives). Every
 * call copies caller memory during the call only; nothing is kept after it returns. */

typedef struct pb_fed_server pb_fed_server; /* rank 0: hands out clients, aggregates */
typedef struct pb_fed_worker pb_fed_worker; /* ranks 1 ..: trains the clients handed to it */

/* Server modes (pb_fed_server_new). */
#define PB_FED_ASYNC 0 /* a worker gets its next client as soon as it returns one */
#define PB_FED_SYNC 1  /* waves of one client per worker, each wave waited for (FLUTE on gloo) */

/* Task commands (pb_fed_task.command, pb_fed_result.command, pb_fed_server_start_round);
 * the same numbers travel in the protocol's header (pybridge/federated/protocol.py). */
#define PB_FED_TRAIN 2    /* train the client; the result is its trained weights */
#define PB_FED_EVALUATE 3 /* evaluate the client; the result is the worker's metrics */

#define PB_FED_MAX_METRICS 32 /* metrics per result (pb_fed_worker_submit_metrics) */

/* One result pulled by the server (pb_fed_server_next_result). */
typedef struct pb_fed_result {
    int32_t command; /* PB_FED_TRAIN or PB_FED_EVALUATE; 0 when a worker failure is described */
    int32_t worker;  /* the worker's rank in the federated group (-1: none) */
    int64_t round;   /* the server's round number, 1 for the first round */
    int64_t client;  /* the client id (-1: none) */
    int64_t samples; /* examples the worker trained or evaluated on */
    int64_t length;  /* elements in the payload (pb_fed_server_result_payload) */
    int32_t dtype;   /* the payload's element type: the model's for PB_FED_TRAIN */
    int32_t reserved;
    double seconds;  /* from handing the client out to the result's arrival */
} pb_fed_result;

/* One task handed to a worker (pb_fed_worker_next_task). */
typedef struct pb_fed_task {
    int32_t command; /* PB_FED_TRAIN or PB_FED_EVALUATE */
    int32_t dtype;   /* the model's element type */
    int64_t round;   /* the server's round number */
    int64_t client;  /* the client to train or evaluate */
    int64_t length;  /* elements in the model (pb_fed_worker_task_model) */
} pb_fed_task;

/* Create the server on rank 0 of `group` and store its handle in *out. COLLECTIVE with the
 * workers' pb_fed_worker_new (both create the links, two subgroups of `group`).
 *   mode             PB_FED_ASYNC or PB_FED_SYNC.
 *   timeout_seconds  how long a worker may hold a client; <= 0 means the group's timeout.
 *   requeue          1: a worker lost while holding a client (dead, or past the timeout)
 *                    has its client handed to the remaining workers, so the round
 *                    completes; 0: pb_fed_server_next_result fails, naming worker and client.
 * Errors: PB_ERR_INVALID_ARGUMENT on a rank other than 0, for a group of one rank, an
 * unknown mode or a requeue other than 0 or 1. */
int pb_fed_server_new(pb_group *group, int32_t mode, double timeout_seconds, int32_t requeue,
                      pb_fed_server **out);

/* Refuse, from the next result on, training updates (pseudo-gradients) whose L2 norm is
 * above `max_norm`; 0 removes the bound (the default). Updates with NaN or Inf elements are
 * always refused. A refused update ends the round like a worker's failure
 * (pb_fed_server_next_result: PB_ERR_CORRUPT, naming worker, client and round); with
 * requeue its client is handed out once more first. Errors: PB_ERR_INVALID_ARGUMENT when
 * max_norm is negative or not finite. */
int pb_fed_server_set_max_norm(pb_fed_server *server, double max_norm);

/* Bound, from the next result on, the sample count a result may claim (samples weight the
 * FedAvg sum): a worker whose result claims more than `max_samples` is retired like one
 * that broke the protocol (named by rank, client and round; with requeue its client goes
 * to the others), so no single update can outweigh the round by claiming more. Set it to
 * the largest client's dataset size; the default is 2^31. Errors:
 * PB_ERR_INVALID_ARGUMENT when max_samples < 1. */
int pb_fed_server_set_max_samples(pb_fed_server *server, int64_t max_samples);

/* Client-to-worker affinity: hand `client` only to the `n` workers (ranks in the
 * federated group) in `workers`, those that hold its data, from the next assignment on;
 * n = 0 lifts it (any worker). A round whose remaining clients can go only to lost workers
 * fails with PB_ERR_COMM. Errors: PB_ERR_INVALID_ARGUMENT for a negative client, a rank
 * that is not a worker's, or NULL workers with n > 0. */
int pb_fed_server_set_affinity(pb_fed_server *server, int64_t client, const int32_t *workers, int32_t n);

/* Start a round: send `model` (any count, a floating-point dtype, read during the call
 * only) to the workers, then hand out the `n` client ids (each >= 0, each once, n >= 1)
 * with `command` (PB_FED_TRAIN or PB_FED_EVALUATE). The server keeps its own copy of the
 * model for aggregation. Results are then pulled with pb_fed_server_next_result. A round
 * may be left unfinished (over-selection): its clients still out are not waited for, their
 * late results are dropped by round number, and their workers get the new round's model
 * once they are back.
 * Errors: PB_ERR_INVALID_ARGUMENT (NULL arrays, n = 0, duplicate or negative ids, an
 * unknown command); PB_ERR_COMM when no worker is left. */
int pb_fed_server_start_round(pb_fed_server *server, const int64_t *clients, int64_t n,
                              const pb_tensor *model, int32_t command);

/* Wait for the round's next result, in completion order. On PB_OK, *has_result is 1 and
 * *out describes it, or *has_result is 0 when every client of the round is done. A
 * PB_FED_TRAIN result of the current round is added to the round's FedAvg sum here (see
 * pb_fed_server_aggregate); its payload is the client's pseudo-gradient (round model -
 * trained weights). The payload and the result's metrics (pb_fed_server_result_metric)
 * stay available until the next call. Errors: PB_ERR_COMM when a worker died, lost its
 * connection or reported a failure (pb_fed_worker_fail) while holding a client;
 * PB_ERR_TIMEOUT when it held the client past the timeout (it is taken back once it
 * answers); PB_ERR_CORRUPT when its update was refused (NaN or Inf elements, or a norm past
 * pb_fed_server_set_max_norm's bound). Then the message names the worker, the client and
 * the round, and *out holds them too (command 0, worker, client, round); with requeue a
 * lost worker's client is handed out again instead (a refused one once), but a reported
 * failure is still returned. An error ends the round: later calls report *has_result 0,
 * the clients not yet handed out are not, and the results of those still out are dropped. */
int pb_fed_server_next_result(pb_fed_server *server, pb_fed_result *out, int32_t *has_result);

/* Copy the last result's payload into `out`: out->count must equal the result's length
 * and out->dtype its dtype. Errors: PB_ERR_INVALID_ARGUMENT when they differ or no
 * result was pulled since the last call to pb_fed_server_next_result. */
int pb_fed_server_result_payload(pb_fed_server *server, const pb_tensor *out);

/* FedAvg the PB_FED_TRAIN results pulled this round: the model's gradient becomes
 * sum(samples_i * pseudo_gradient_i) / sum(samples_i) (a float64 sum: the order results
 * came in does not matter beyond float64 rounding) and SGD with learning rate `lr` steps
 * (1.0 is plain FedAvg: the sample-weighted mean of the clients' weights). The new model
 * is written to `model` (same count and dtype as the round's); the number of clients
 * aggregated to *clients (may be NULL). The sum is then cleared.
 * Errors: PB_ERR_INVALID_ARGUMENT when no samples were pulled, lr is not > 0, or `model`
 * does not match the round's model. */
int pb_fed_server_aggregate(pb_fed_server *server, double lr, const pb_tensor *model,
                            int32_t *clients);

/* The last pulled result's metric `name` (as the worker sent it): *found is 1 and *value
 * holds it, or *found is 0 when the result has no metric of that name.
 * Errors: PB_ERR_INVALID_ARGUMENT when no result was pulled since the last call to
 * pb_fed_server_next_result, or a pointer is NULL. */
int pb_fed_server_result_metric(pb_fed_server *server, const char *name, double *value, int32_t *found);

/* The current round's sample-weighted mean of metric `name` over the results pulled so
 * far (sum(samples_i * value_i) / sum(samples_i) over those that sent it; their plain mean
 * when they all have 0 samples): *found 0 when none sent it.
 * Errors: PB_ERR_INVALID_ARGUMENT before the first round, or a pointer is NULL. */
int pb_fed_server_round_metric(pb_fed_server *server, const char *name, double *value, int32_t *found);

/* Terminate the workers and stop the server's threads. A worker still holding a client is
 * waited for until that client's deadline (hand-out + the server's timeout); one past it
 * (stalled or hung) is cut off at once, so no thread is left and the call never waits for
 * it (that worker's next call fails with PB_ERR_COMM naming the lost server, rank 0). The
 * handle is released, also when an error is returned; later use returns
 * PB_ERR_INVALID_ARGUMENT. */
int pb_fed_server_close(pb_fed_server *server);

/* Create a worker on a rank other than 0 of `group` and store its handle in *out.
 * COLLECTIVE with the server's pb_fed_server_new.
 * Errors: PB_ERR_INVALID_ARGUMENT on rank 0 or for a group of one rank. */
int pb_fed_worker_new(pb_group *group, pb_fed_worker **out);

/* Block until the server hands out a client. On PB_OK, *has_task is 1 and *task describes
 * it (fetch the model with pb_fed_worker_task_model), or *has_task is 0 once the server
 * has terminated the federation (the worker is then done: close it). Each task must be
 * answered (pb_fed_worker_submit or pb_fed_worker_fail) before the next call.
 * Errors: PB_ERR_INVALID_ARGUMENT when the previous task is unanswered; PB_ERR_COMM when
 * the server's connection broke (it died: the message names rank 0); the call does not
 * wait on a dead server. */
int pb_fed_worker_next_task(pb_fed_worker *worker, pb_fed_task *task, int32_t *has_task);

/* Copy the open task's model (the round's model) into `out`: out->count must equal the
 * task's length and out->dtype its dtype. May be called more than once per task. */
int pb_fed_worker_task_model(pb_fed_worker *worker, const pb_tensor *out);

/* Answer the open task. PB_FED_TRAIN: `result` holds the client's trained weights (the
 * model's count and dtype) and `samples` the number of examples trained on; the server
 * receives the pseudo-gradient. PB_FED_EVALUATE: `result` holds any metrics (any count,
 * any dtype) and `samples` the number of examples evaluated. Read during the call only.
 * Errors: PB_ERR_INVALID_ARGUMENT when no task is open, samples < 0 or the weights do
 * not match the model (the task stays open: submit again or fail it). */
int pb_fed_worker_submit(pb_fed_worker *worker, const pb_tensor *result, int64_t samples);

/* pb_fed_worker_submit with `n` metrics (0 to PB_FED_MAX_METRICS): names[i] (identifiers
 * of at most 64 characters: letters, digits, _ . : / -) has values[i], e.g. "loss" and
 * "accuracy". The server returns them with the result and averages each over the round,
 * weighted by samples (pb_fed_server_result_metric, pb_fed_server_round_metric).
 * Errors: those of pb_fed_worker_submit; PB_ERR_INVALID_ARGUMENT for a bad name, n out of
 * range, or NULL arrays with n > 0 (the task stays open). PB_ERR_COMM when the server is
 * lost (the message names rank 0). */
int pb_fed_worker_submit_metrics(pb_fed_worker *worker, const pb_tensor *result, int64_t samples, int32_t n,
                                 const char *const *names, const double *values);

/* Tell the server that the open task could not be done; `message` (UTF-8, may be NULL)
 * is part of the server's error. */
int pb_fed_worker_fail(pb_fed_worker *worker, const char *message);

/* Release the worker (leaving the federation early if the server has not terminated it:
 * the server then sees it as lost). The handle is then unknown. */
int pb_fed_worker_close(pb_fed_worker *worker);

/* Deprecated: use pb_fed_worker_close (the same function). */
int pb_fed_worker_free(pb_fed_worker *worker);

/* Seeded client sampling: the `per_round` distinct client ids of 0 .. num_clients-1 drawn
 * for `round` of a run seeded `seed`, sorted, into out[0 .. per_round-1]. The same for a
 * given (seed, round) on every run and from Python, C and Go (one implementation), so a
 * resumed run draws its remaining rounds as an uninterrupted one would. Not collective.
 * Errors: PB_ERR_INVALID_ARGUMENT unless 1 <= per_round <= num_clients and round >= 0, or
 * out is NULL. */
int pb_fed_sample_clients(int64_t num_clients, int64_t per_round, int64_t seed, int64_t round, int64_t *out);

/* ---- Federated server strategies, FedBuff / FedAsync, central DP ------------------ */
/* (docs/federated.md "Modes" and "Strategies"; pybridge/federated/strategies.py,
 * buffered.py, staleness.py.) */

/* Buffered asynchronous modes (pb_fed_server_new's mode, beside PB_FED_ASYNC and
 * PB_FED_SYNC): no rounds for the workers; a worker that returns a result gets its next
 * client at once on the newest model version, and the server's model steps every
 * buffer_size training results pulled, each weighted by its staleness. A "round" is the
 * clients of one pb_fed_server_start_round: pb_fed_server_next_result reports
 * *has_result 0 as soon as they are all handed out and a worker is idle; the clients
 * still out stay out and their results come with later rounds (applied late).
 * pb_fed_server_aggregate then copies the current model out and gives the number of
 * clients stepped since its last call (0 is no error); its lr, if > 0, becomes eta for
 * the steps to come. start_round's model becomes a new version only if it differs from
 * the server's (pass back what aggregate wrote). pb_fed_result.round is the version a
 * result was computed on (its staleness: the current version, pb_fed_step.version, minus
 * it). Failures end a round as in the round modes. */
#define PB_FED_FEDBUFF 2  /* FedBuff (Nguyen et al. 2022): a step every buffer_size results */
#define PB_FED_FEDASYNC 3 /* FedAsync (Xie et al. 2019): a step at every result */

/* Server optimizers (pb_fed_options.strategy), applied to the pseudo-gradient g of a step
 * (Reddi et al. 2021; Delta = -g):
 *   FEDAVG      x -= eta * g (momentum m = momentum * m + g; x -= eta * m)
 *   FEDADAGRAD  v += Delta^2
 *   FEDADAM     v = beta2 * v + (1 - beta2) * Delta^2
 *   FEDYOGI     v -= (1 - beta2) * Delta^2 * sign(v - Delta^2)
 * the adaptive ones with m = beta1 * m + (1 - beta1) * Delta, v starting at tau^2, and
 * x += eta * m / (sqrt(v) + tau). */
#define PB_FED_STRATEGY_FEDAVG 0
#define PB_FED_STRATEGY_FEDADAGRAD 1
#define PB_FED_STRATEGY_FEDADAM 2
#define PB_FED_STRATEGY_FEDYOGI 3

/* Staleness functions (pb_fed_options.staleness) of an update tau versions old:
 * CONSTANT 1; POLYNOMIAL (1 + tau)^-a; HINGE 1 if tau <= b, else 1 / (a (tau - b) + 1). */
#define PB_FED_STALENESS_CONSTANT 0
#define PB_FED_STALENESS_POLYNOMIAL 1
#define PB_FED_STALENESS_HINGE 2

/* How a federated server aggregates (pb_fed_server_configure). Fill it with
 * pb_fed_options_init, then change what you need. Size-prefixed as pb_reducer_options:
 * fields past the caller's `size` take their defaults. */
typedef struct pb_fed_options {
    uint32_t size;               /* sizeof(pb_fed_options): set by pb_fed_options_init */
    int32_t strategy;            /* PB_FED_STRATEGY_* (default FEDAVG) */
    double eta;                  /* server learning rate of the buffered modes' steps (in the round
                                    modes each pb_fed_server_aggregate's lr is its step's);
                                    0 (default): 1 for FEDAVG, 0.01 otherwise */
    double momentum;             /* FEDAVG's server momentum in [0, 1) (default 0) */
    double beta1;                /* adaptive: default 0.9 */
    double beta2;                /* adaptive: default 0.99 */
    double tau;                  /* adaptive: default 1e-3 */
    int32_t buffer_size;         /* PB_FED_FEDBUFF's K; 0 (default): 10 (FEDASYNC: 1) */
    int32_t staleness;           /* PB_FED_STALENESS_* (default CONSTANT); buffered modes only */
    double staleness_a;          /* POLYNOMIAL's and HINGE's a (default 0.5 and 10) when < 0 */
    double staleness_b;          /* HINGE's b (default 4) when < 0 */
    int64_t max_staleness;       /* buffered modes: refuse updates older than this; -1 (default): any */
    double dp_clip_norm;         /* central DP: clip each client's delta to this L2 norm; 0 (default): no DP */
    double dp_noise_multiplier;  /* central DP: noise std = multiplier * clip / clients per step */
    int64_t dp_seed;             /* central DP: the noise generator's seed (default 0) */
    const char *strategy_name;   /* NULL (default): `strategy` chooses. Else the strategy of that
                                    name: a built-in's (its PB_FED_STRATEGY_ code in lower case:
                                    "fedadam") or one a module registered (pb_import_module),
                                    given the fields above that it takes; `strategy` then stays
                                    at its default. An unknown name is PB_ERR_INVALID_ARGUMENT
                                    listing every name. Read during the call only */
} pb_fed_options;

/* Fill *options with the defaults above (size included). Sets every field. */
static inline void pb_fed_options_init(pb_fed_options *options) {
    options->size = (uint32_t)sizeof(pb_fed_options);
    options->strategy = PB_FED_STRATEGY_FEDAVG;
    options->eta = 0;
    options->momentum = 0;
    options->beta1 = 0.9;
    options->beta2 = 0.99;
    options->tau = 1e-3;
    options->buffer_size = 0;
    options->staleness = PB_FED_STALENESS_CONSTANT;
    options->staleness_a = -1;
    options->staleness_b = -1;
    options->max_staleness = -1;
    options->dp_clip_norm = 0;
    options->dp_noise_multiplier = 0;
    options->dp_seed = 0;
    options->strategy_name = 0;
}

/* Set how `server` aggregates: before its first round (NULL: the defaults).
 * Errors: PB_ERR_INVALID_ARGUMENT for a bad value (named), buffered settings
 * (buffer_size, staleness, max_staleness) on a PB_FED_ASYNC or PB_FED_SYNC server, or a
 * round already started. */
int pb_fed_server_configure(pb_fed_server *server, const pb_fed_options *options);

/* What the server's last model step did (a round's aggregate, or a buffered step). */
typedef struct pb_fed_step {
    int64_t version;          /* the model version the step made (the round, in round modes) */
    int32_t clients;          /* updates in the step */
    int32_t clipped;          /* of which central DP clipped */
    int64_t samples;          /* their samples */
    int64_t max_staleness;    /* the oldest update's staleness, in versions (0 in round modes) */
    double lr;                /* the server learning rate used */
    double clip_norm;         /* central DP's clip norm (0: no DP) */
    double noise_multiplier;  /* central DP's noise multiplier */
    double noise_std;         /* the noise's standard deviation this step */
} pb_fed_step;

/* Describe the last model step in *out; *has_step 0 (and *out zeroed) before any. Also
 * the count of updates refused as too stale so far in *refused (may be NULL). */
int pb_fed_server_last_step(pb_fed_server *server, pb_fed_step *out, int32_t *has_step, int64_t *refused);

/* ---- Observability: traces, metrics, the program's spans and scalars ------------- */
/* Each rank records what the library does (collectives numbered by sequence, the reducer's
 * buckets and waits, the loader, steps split into data wait, compute and exposed
 * communication) and what the program marks with the calls below: into
 * trace_dir/rank<R>.trace.json (Chrome Trace Event JSON: chrome://tracing, Perfetto),
 * trace_dir/metrics/rank<R>.jsonl (a row every 50 steps), trace_dir/tensorboard/rank<R>/,
 * and a Prometheus endpoint. Off by default: the calls below then do nothing and return
 * PB_OK. On by pb_observe_start, or PYBRIDGE_TRACE=DIR or PYBRIDGE_METRICS_PORT=PORT in the
 * environment; recording starts at pb_init (which then measures this rank's clock against
 * rank 0's, so the ranks' traces merge on one time line) and goes on across later worlds.
 * The files are written at pb_finalize, at exit and at pb_observe_flush. Not collectives:
 * every call is local. Names and categories are checked only while recording. */

/* Record this process: trace and metrics files into directory `trace_dir` (created if
 * missing; NULL or "": no files) and/or a Prometheus endpoint on loopback port
 * `metrics_port` + the local rank (0: any free port; < 0: no endpoint). Call before pb_init
 * (recording starts there, clocks aligned); after it, recording starts at once, clocks not
 * aligned. Errors: PB_ERR_INVALID_ARGUMENT (neither a directory nor a port, a port above
 * 65535). A directory that cannot be created (PB_ERR_INVALID_ARGUMENT) or a port in use
 * (PB_ERR_IO) fails where recording starts: here, or at pb_init. */
int pb_observe_start(const char *trace_dir, int metrics_port);

/* *out receives 1 if this process records now, else 0. */
int pb_observe_enabled(int *out);

/* Write the trace file and the metrics files now (PB_OK and nothing written when not
 * recording). Errors: PB_ERR_IO (the files could not be written). */
int pb_observe_flush(void);

/* Begin the program's span `name` on its track of the trace and store its id in *out_span
 * for pb_span_end; when not recording, *out_span receives 0. A span may end on another
 * thread than it began on. `category` puts its time in the step breakdown: "data"
 * (waiting for data), "comm" (exposed communication), "forward", or "user" (NULL),
 * "compute", "checkpoint", "elastic" (counted as compute). Errors: PB_ERR_INVALID_ARGUMENT
 * (NULL name or out_span; while recording: an empty name, an unknown category). */
int pb_span_begin(const char *name, const char *category, int64_t *out_span);

/* End the span pb_span_begin gave; 0 (what it gives when not recording) does nothing.
 * Errors: PB_ERR_INVALID_ARGUMENT (a span that is not open: ended already, or never begun). */
int pb_span_end(int64_t span);

/* Mark a moment `name` on the program's track (category as pb_span_begin's). Errors: those
 * of pb_span_begin. */
int pb_instant(const char *name, const char *category);

/* Log the program's scalar `name` (a loss, an accuracy) at step `step` (< 0: the current
 * step): a counter in the trace, the metrics rows, TensorBoard and Prometheus. Errors:
 * PB_ERR_INVALID_ARGUMENT (NULL name; while recording: an empty name, a NaN value). */
int pb_log_scalar(const char *name, double value, int64_t step);

/* End the current step. Without this call each reducer iteration (pb_reducer_wait) ends a
 * step; after the first call, only this call does (the steps iterations ended before it stay
 * counted; an iteration that ended just before the first call, with nothing recorded in
 * between, is that call's step, not one more). *out_steps (may be NULL) receives the number
 * of steps ended so far (0 when not recording). */
int pb_step_end(int64_t *out_steps);

#ifdef __cplusplus
}
#endif
#endif /* PYBRIDGE_H */
