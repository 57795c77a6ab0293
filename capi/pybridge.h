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
 *             saying what was wrong. Nothing here aborts, raises or longjmps:
 *             NULL pointers, bad counts, unknown codes, stale handles and calls
 *             out of order all return an error status.
 *
 *  Memory.    Synchronous calls read and write the caller's memory, described by
 *             a pb_tensor, only while the call runs; they do not copy it (CPU data
 *             is wrapped in place). Asynchronous calls work only on pb_buffer
 *             objects, whose memory the library owns, so no caller pointer is
 *             kept after a call returns (as cgo's pointer rules require).
 *
 *  Handles.   pb_group, pb_buffer and pb_work are opaque handles. A handle that
 *             was freed, closed, or never issued by this library is rejected with
 *             PB_ERR_INVALID_ARGUMENT or PB_ERR_CLOSED, never dereferenced.
 *
 *  Threads.   Every function may be called from any thread. Calls are serialized
 *             inside the library (the embedded interpreter's lock) but a blocking
 *             collective does not stop other threads' calls. COLLECTIVES MUST BE
 *             ISSUED IN THE SAME ORDER ON EVERY RANK: when several threads issue
 *             collectives concurrently, the caller must order them.
 *
 *  Signals.   The library installs no signal handlers; SIGINT and SIGTERM stay
 *             the host program's.
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

/* ---- Element types (pb_tensor.dtype) ---------------------------------------- */
#define PB_FLOAT32 0
#define PB_FLOAT64 1
#define PB_FLOAT16 2  /* IEEE half: raw uint16 bits */
#define PB_BFLOAT16 3 /* bfloat16: raw uint16 bits */
#define PB_INT8 4
#define PB_UINT8 5
#define PB_INT32 6
#define PB_INT64 7

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

/* ---- Errors and version (pure C: usable before and without the Python core) ---- */

/* The message of the last failed call on the calling thread, or "" if none.
 * The string is owned by the library and valid until the thread's next failing call. */
const char *pb_last_error(void);

/* The constant name of a status code, e.g. "PB_ERR_TIMEOUT"; "PB_UNKNOWN" otherwise. */
const char *pb_status_name(int status);

/* The library version, e.g. "0.1.0". */
const char *pb_version(void);

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
 * Errors: PB_ERR_ALREADY_INITIALIZED if a group is live; PB_ERR_TIMEOUT if a peer does
 * not join in time; PB_ERR_INVALID_ARGUMENT for bad values or a missing environment. */
int pb_init(const char *init_method, const char *backend, int32_t rank, int32_t world_size,
            int32_t local_rank, double timeout_seconds, pb_group **out);

/* Leave the process group. The handle stays known but every later use returns
 * PB_ERR_CLOSED; a second pb_finalize on it is a no-op returning PB_OK. */
int pb_finalize(pb_group *group);

/* This process's rank, the world size, the rank on this node. */
int pb_rank(pb_group *group, int32_t *out);
int pb_size(pb_group *group, int32_t *out);
int pb_local_rank(pb_group *group, int32_t *out);

/* The device this rank should compute on: its CUDA index under nccl, PB_CPU under gloo. */
int pb_device(pb_group *group, int32_t *out);

/* Block until every rank has called pb_barrier. */
int pb_barrier(pb_group *group);

/* ---- Synchronous collectives (in place on caller memory) ------------------------- */

/* Copy `t` from rank `root` into `t` on every rank. Every rank passes the same count and dtype. */
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

/* Describe the buffer's memory in *out. The pointer stays valid until pb_buffer_free;
 * the caller may read and write it, except while an operation on it is in flight. */
int pb_buffer_tensor(pb_buffer *buffer, pb_tensor *out);

/* Release the buffer. Memory still used by an operation in flight is released
 * when that operation finishes, but the caller must not touch it after this call. */
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

/* Wait for the operation; timeout_seconds <= 0 waits up to the group's timeout.
 * Returns the operation's own status (e.g. PB_ERR_COMM if a peer died) once done. */
int pb_work_wait(pb_work *work, double timeout_seconds);

/* Store 1 in *done if the operation has finished (and return its status), else 0. */
int pb_work_test(pb_work *work, int32_t *done);

/* Release the work handle. Freeing unfinished work does not cancel it. */
int pb_work_free(pb_work *work);

#ifdef __cplusplus
}
#endif
#endif /* PYBRIDGE_H */
