/*
 * pbgo_reducer.h - static helpers between reducer.go and the gradient reducer of
 * pybridge.h. As in pbgo.h, each helper copies pb_last_error() in the same cgo call
 * as the failing library call (a goroutine may change OS threads between calls).
 */
#ifndef PBGO_REDUCER_H
#define PBGO_REDUCER_H

#include "pbgo.h"

static inline int pbgo_reducer_new(pb_group *g, int32_t n, const int64_t *counts,
                                   const int32_t *dtypes, double cap_mb, int32_t op,
                                   int32_t compression, int32_t flags, pb_reducer **out,
                                   char **msg) {
	return pbgo_status(pb_reducer_new(g, n, counts, dtypes, cap_mb, op, compression, flags, out),
	                   msg);
}

/* Describes all n views in out (C memory) and stores the generation in *gen. */
static inline int pbgo_reducer_views(pb_reducer *r, int32_t n, pb_tensor *out, int64_t *gen,
                                     char **msg) {
	int st = pb_reducer_grads(r, n, out);
	if (st == PB_OK) st = pb_reducer_generation(r, gen);
	return pbgo_status(st, msg);
}

static inline int pbgo_reducer_mark_ready(pb_reducer *r, int32_t i, char **msg) {
	return pbgo_status(pb_reducer_mark_ready(r, i), msg);
}

/* Waits, then reads the generation (also after a failed wait) into *gen. */
static inline int pbgo_reducer_wait(pb_reducer *r, double timeout_seconds, int64_t *gen,
                                    char **msg) {
	int st = pb_reducer_wait(r, timeout_seconds);
	pbgo_status(st, msg);
	if (pb_reducer_generation(r, gen) != PB_OK) *gen = -1;
	return st;
}

static inline int pbgo_reducer_zero(pb_reducer *r, char **msg) {
	return pbgo_status(pb_reducer_zero(r), msg);
}

static inline int pbgo_reducer_free(pb_reducer *r, char **msg) {
	return pbgo_status(pb_reducer_free(r), msg);
}

static inline int pbgo_broadcast_params(pb_group *g, int32_t n, const pb_tensor *tensors,
                                        int32_t root, char **msg) {
	return pbgo_status(pb_broadcast_params(g, n, tensors, root), msg);
}

#endif /* PBGO_REDUCER_H */
