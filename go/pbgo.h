/*
 * pbgo.h - static helpers between the Go package and pybridge.h.
 *
 * pb_last_error() is thread-local and a goroutine may move to another OS thread
 * between two cgo calls, so every helper makes the library call and, on failure,
 * copies the message in the same cgo call. Tensor descriptors are built here, on
 * the C stack, so Go never hands C a Go struct that holds a Go pointer.
 */
#ifndef PBGO_H
#define PBGO_H

#include <stdlib.h>
#include <string.h>
#include <pybridge.h>

/* Returns st; on failure stores a malloc'd copy of pb_last_error() in *msg (Go frees it). */
static inline int pbgo_status(int st, char **msg) {
	if (st != PB_OK && msg != NULL) {
		const char *m = pb_last_error();
		*msg = strdup(m != NULL ? m : "");
	}
	return st;
}

static inline pb_tensor pbgo_tensor(void *data, int64_t count, int32_t dtype) {
	pb_tensor t;
	t.data = data;
	t.count = count;
	t.dtype = dtype;
	t.device = PB_CPU;
	return t;
}

static inline int pbgo_init(const char *init_method, const char *backend, int32_t rank,
                            int32_t world_size, int32_t local_rank, double timeout_seconds,
                            int32_t flags, double watchdog_seconds, pb_group **out, char **msg) {
	return pbgo_status(pb_init_v2(init_method, backend, rank, world_size, local_rank,
	                              timeout_seconds, flags, watchdog_seconds, out), msg);
}

/* Fills info with rank, size, local rank and device. */
static inline int pbgo_info(pb_group *g, int32_t *info, char **msg) {
	int st = pb_rank(g, &info[0]);
	if (st == PB_OK) st = pb_size(g, &info[1]);
	if (st == PB_OK) st = pb_local_rank(g, &info[2]);
	if (st == PB_OK) st = pb_device(g, &info[3]);
	return pbgo_status(st, msg);
}

static inline int pbgo_finalize(pb_group *g, char **msg) {
	return pbgo_status(pb_finalize(g), msg);
}

static inline int pbgo_group_split(pb_group *g, int32_t color, int32_t key, pb_group **out, char **msg) {
	return pbgo_status(pb_group_split(g, color, key, out), msg);
}

static inline int pbgo_group_new(pb_group *g, const int32_t *ranks, int32_t n, pb_group **out,
                                 char **msg) {
	return pbgo_status(pb_group_new(g, ranks, n, out), msg);
}

static inline int pbgo_group_nodes(pb_group *g, int32_t per_node, pb_group **intra, pb_group **cross,
                                   char **msg) {
	return pbgo_status(pb_group_nodes(g, per_node, intra, cross), msg);
}

static inline int pbgo_group_ranks(pb_group *g, int32_t size, int32_t *global, char **msg) {
	int st = PB_OK;
	for (int32_t i = 0; i < size && st == PB_OK; i++) st = pb_group_global_rank(g, i, &global[i]);
	return pbgo_status(st, msg);
}

static inline int pbgo_group_free(pb_group *g, char **msg) {
	return pbgo_status(pb_group_free(g), msg);
}

static inline int pbgo_reducer_set_hook(pb_reducer *r, int32_t hook, int32_t rank, int32_t flags,
                                        char **msg) {
	return pbgo_status(pb_reducer_set_hook(r, hook, rank, flags), msg);
}

static inline int pbgo_reducer_set_gossip(pb_reducer *r, int32_t topology, int32_t per_node, int64_t seed,
                                          int32_t sync_every, char **msg) {
	return pbgo_status(pb_reducer_set_gossip(r, topology, per_node, seed, sync_every), msg);
}

static inline int pbgo_reducer_set_shapes(pb_reducer *r, int32_t n, const int32_t *ndims,
                                          const int64_t *dims, char **msg) {
	return pbgo_status(pb_reducer_set_shapes(r, n, ndims, dims), msg);
}

static inline int pbgo_barrier(pb_group *g, char **msg) {
	return pbgo_status(pb_barrier(g), msg);
}

static inline int pbgo_broadcast(pb_group *g, void *data, int64_t n, int32_t dtype,
                                 int32_t root, char **msg) {
	pb_tensor t = pbgo_tensor(data, n, dtype);
	return pbgo_status(pb_broadcast(g, &t, root), msg);
}

static inline int pbgo_all_reduce(pb_group *g, void *data, int64_t n, int32_t dtype,
                                  int32_t op, char **msg) {
	pb_tensor t = pbgo_tensor(data, n, dtype);
	return pbgo_status(pb_all_reduce(g, &t, op), msg);
}

static inline int pbgo_all_gather(pb_group *g, void *in, int64_t nin, void *out, int64_t nout,
                                  int32_t dtype, char **msg) {
	pb_tensor ti = pbgo_tensor(in, nin, dtype);
	pb_tensor to = pbgo_tensor(out, nout, dtype);
	return pbgo_status(pb_all_gather(g, &ti, &to), msg);
}

static inline int pbgo_reduce_scatter(pb_group *g, void *in, int64_t nin, void *out,
                                      int64_t nout, int32_t dtype, int32_t op, char **msg) {
	pb_tensor ti = pbgo_tensor(in, nin, dtype);
	pb_tensor to = pbgo_tensor(out, nout, dtype);
	return pbgo_status(pb_reduce_scatter(g, &ti, &to, op), msg);
}

static inline int pbgo_send(pb_group *g, void *data, int64_t n, int32_t dtype, int32_t dst,
                            int32_t tag, char **msg) {
	pb_tensor t = pbgo_tensor(data, n, dtype);
	return pbgo_status(pb_send(g, &t, dst, tag), msg);
}

static inline int pbgo_recv(pb_group *g, void *data, int64_t n, int32_t dtype, int32_t src,
                            int32_t tag, char **msg) {
	pb_tensor t = pbgo_tensor(data, n, dtype);
	return pbgo_status(pb_recv(g, &t, src, tag), msg);
}

/* Allocates a host buffer and describes its memory; frees it again if that fails. */
static inline int pbgo_buffer_new(int32_t dtype, int64_t n, pb_buffer **out, void **data,
                                  int64_t *count, char **msg) {
	pb_buffer *b = NULL;
	pb_tensor t;
	int st = pb_buffer_new(dtype, n, PB_CPU, &b);
	if (st != PB_OK) return pbgo_status(st, msg);
	st = pb_buffer_tensor(b, &t);
	if (st != PB_OK) {
		pbgo_status(st, msg);
		pb_buffer_free(b);
		return st;
	}
	*out = b;
	*data = t.data;
	*count = t.count;
	return PB_OK;
}

static inline int pbgo_buffer_free(pb_buffer *b, char **msg) {
	return pbgo_status(pb_buffer_free(b), msg);
}

static inline int pbgo_broadcast_async(pb_group *g, pb_buffer *b, int32_t root, pb_work **w,
                                       char **msg) {
	return pbgo_status(pb_broadcast_async(g, b, root, w), msg);
}

static inline int pbgo_all_reduce_async(pb_group *g, pb_buffer *b, int32_t op, pb_work **w,
                                        char **msg) {
	return pbgo_status(pb_all_reduce_async(g, b, op, w), msg);
}

static inline int pbgo_all_gather_async(pb_group *g, pb_buffer *in, pb_buffer *out, pb_work **w,
                                        char **msg) {
	return pbgo_status(pb_all_gather_async(g, in, out, w), msg);
}

static inline int pbgo_reduce_scatter_async(pb_group *g, pb_buffer *in, pb_buffer *out,
                                            int32_t op, pb_work **w, char **msg) {
	return pbgo_status(pb_reduce_scatter_async(g, in, out, op, w), msg);
}

static inline int pbgo_isend(pb_group *g, pb_buffer *b, int32_t dst, int32_t tag, pb_work **w,
                             char **msg) {
	return pbgo_status(pb_isend(g, b, dst, tag, w), msg);
}

static inline int pbgo_irecv(pb_group *g, pb_buffer *b, int32_t src, int32_t tag, pb_work **w,
                             char **msg) {
	return pbgo_status(pb_irecv(g, b, src, tag, w), msg);
}

static inline int pbgo_work_wait(pb_work *w, double timeout_seconds, char **msg) {
	return pbgo_status(pb_work_wait(w, timeout_seconds), msg);
}

static inline int pbgo_work_test(pb_work *w, int32_t *done, char **msg) {
	return pbgo_status(pb_work_test(w, done), msg);
}

static inline int pbgo_work_free(pb_work *w, char **msg) {
	return pbgo_status(pb_work_free(w), msg);
}

#endif /* PBGO_H */
