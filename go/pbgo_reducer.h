/*
 * pbgo_reducer.h - the hand-written helpers between reducer.go and the gradient reducer
 * of pybridge.h; the one-call trampolines (pbgo_reducer_new, ...) are generated (pbgo_gen.h).
 */
#ifndef PBGO_REDUCER_H
#define PBGO_REDUCER_H

#include "pbgo.h"

/* Describes all n views in out (C memory) and stores the generation in *gen. */
static inline int pbgo_reducer_views(pb_reducer *r, int32_t n, pb_tensor *out, int64_t *gen,
                                     char **msg) {
	int st = pb_reducer_grads(r, n, out);
	if (st == PB_OK) st = pb_reducer_generation(r, gen);
	return pbgo_status(st, msg);
}

/* Waits, then reads the generation (also after a failed wait) into *gen. */
static inline int pbgo_reducer_wait_generation(pb_reducer *r, double timeout_seconds, int64_t *gen,
                                               char **msg) {
	int st = pb_reducer_wait(r, timeout_seconds);
	pbgo_status(st, msg);
	if (pb_reducer_generation(r, gen) != PB_OK) *gen = -1;
	return st;
}

/* Polls (pb_reducer_poll), then reads the generation (also after a failure) into *gen. */
static inline int pbgo_reducer_poll_generation(pb_reducer *r, double timeout_seconds, int32_t *done,
                                               int64_t *gen, char **msg) {
	int st = pb_reducer_poll(r, timeout_seconds, done);
	pbgo_status(st, msg);
	if (pb_reducer_generation(r, gen) != PB_OK) *gen = -1;
	return st;
}

#endif /* PBGO_REDUCER_H */
