/*
 * pbgo.h - C helpers between the Go package and pybridge.h.
 *
 * pb_last_error() is thread-local and a goroutine may move to another OS thread between
 * two cgo calls, so Go calls the library only through helpers that make the call and, on
 * failure, copy the message in the same cgo call (pbgo_status). pbgo_gen.h, generated
 * from the header, holds one such trampoline per function: pbgo_NAME takes pb_NAME's
 * arguments and char **msg. Written by hand, here and in pbgo_<area>.h, are only the
 * helpers that make more than one call or build tensor descriptors: the *_slice helpers
 * describe a Go slice on the C stack, so Go never hands C a Go struct holding a Go pointer.
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

#include "pbgo_gen.h"

static inline pb_tensor pbgo_tensor(void *data, int64_t count, int32_t dtype) {
	pb_tensor t;
	t.data = data;
	t.count = count;
	t.dtype = dtype;
	t.device = PB_CPU;
	return t;
}

/* ---- Groups ---- */

/* Fills info with rank, size, local rank and device. */
static inline int pbgo_info(pb_group *g, int32_t *info, char **msg) {
	int st = pb_rank(g, &info[0]);
	if (st == PB_OK) st = pb_size(g, &info[1]);
	if (st == PB_OK) st = pb_local_rank(g, &info[2]);
	if (st == PB_OK) st = pb_device(g, &info[3]);
	return pbgo_status(st, msg);
}

/* Fills global with the global rank of each of the group's size members. */
static inline int pbgo_group_ranks(pb_group *g, int32_t size, int32_t *global, char **msg) {
	int st = PB_OK;
	for (int32_t i = 0; i < size && st == PB_OK; i++) st = pb_group_global_rank(g, i, &global[i]);
	return pbgo_status(st, msg);
}

/* ---- Collectives on Go slices (host memory, described here) ---- */

static inline int pbgo_broadcast_slice(pb_group *g, void *data, int64_t n, int32_t dtype,
                                       int32_t root, char **msg) {
	pb_tensor t = pbgo_tensor(data, n, dtype);
	return pbgo_status(pb_broadcast(g, &t, root), msg);
}

static inline int pbgo_all_reduce_slice(pb_group *g, void *data, int64_t n, int32_t dtype,
                                        int32_t op, char **msg) {
	pb_tensor t = pbgo_tensor(data, n, dtype);
	return pbgo_status(pb_all_reduce(g, &t, op), msg);
}

static inline int pbgo_all_gather_slice(pb_group *g, void *in, int64_t nin, void *out, int64_t nout,
                                        int32_t dtype, char **msg) {
	pb_tensor ti = pbgo_tensor(in, nin, dtype);
	pb_tensor to = pbgo_tensor(out, nout, dtype);
	return pbgo_status(pb_all_gather(g, &ti, &to), msg);
}

static inline int pbgo_reduce_scatter_slice(pb_group *g, void *in, int64_t nin, void *out,
                                            int64_t nout, int32_t dtype, int32_t op, char **msg) {
	pb_tensor ti = pbgo_tensor(in, nin, dtype);
	pb_tensor to = pbgo_tensor(out, nout, dtype);
	return pbgo_status(pb_reduce_scatter(g, &ti, &to, op), msg);
}

static inline int pbgo_send_slice(pb_group *g, void *data, int64_t n, int32_t dtype, int32_t dst,
                                  int32_t tag, char **msg) {
	pb_tensor t = pbgo_tensor(data, n, dtype);
	return pbgo_status(pb_send(g, &t, dst, tag), msg);
}

static inline int pbgo_recv_slice(pb_group *g, void *data, int64_t n, int32_t dtype, int32_t src,
                                  int32_t tag, char **msg) {
	pb_tensor t = pbgo_tensor(data, n, dtype);
	return pbgo_status(pb_recv(g, &t, src, tag), msg);
}

/* ---- Buffers ---- */

/* Allocates a host buffer and describes its memory; closes it again if that fails. */
static inline int pbgo_buffer_new_host(int32_t dtype, int64_t n, pb_buffer **out, void **data,
                                       int64_t *count, char **msg) {
	pb_buffer *b = NULL;
	pb_tensor t;
	int st = pb_buffer_new(dtype, n, PB_CPU, &b);
	if (st != PB_OK) return pbgo_status(st, msg);
	st = pb_buffer_tensor(b, &t);
	if (st != PB_OK) {
		pbgo_status(st, msg);
		pb_buffer_close(b);
		return st;
	}
	*out = b;
	*data = t.data;
	*count = t.count;
	return PB_OK;
}

#endif /* PBGO_H */
