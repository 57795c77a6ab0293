/*
 * pbgo_loader.h - static helpers between loader.go and the RecordIO loader of
 * pybridge.h. As in pbgo.h, each helper makes the library call and copies
 * pb_last_error() in the same cgo call (a goroutine may change OS threads
 * between two cgo calls, and the message is thread-local).
 */
#ifndef PBGO_LOADER_H
#define PBGO_LOADER_H

#include "pbgo.h"

/* files: a C array of nfiles C strings, in C memory (cgo forbids Go pointers to Go pointers). */
static inline int pbgo_loader_open(pb_group *g, char **files, int32_t nfiles, int64_t batch_size,
                                   int32_t partition, int32_t shuffle, int64_t seed,
                                   int32_t drop_last, int32_t skip_corrupt, pb_loader **out,
                                   char **msg) {
	return pbgo_status(pb_loader_open(g, (const char *const *)files, nfiles, batch_size,
	                                  partition, shuffle, seed, drop_last, skip_corrupt, out),
	                   msg);
}

static inline int pbgo_loader_next(pb_loader *l, const uint8_t **data, const int64_t **offsets,
                                   int64_t *count, int32_t *has_batch, char **msg) {
	return pbgo_status(pb_loader_next(l, data, offsets, count, has_batch), msg);
}

static inline int pbgo_loader_set_epoch(pb_loader *l, int64_t epoch, char **msg) {
	return pbgo_status(pb_loader_set_epoch(l, epoch), msg);
}

static inline int pbgo_loader_epoch(pb_loader *l, int64_t *out, char **msg) {
	return pbgo_status(pb_loader_epoch(l, out), msg);
}

static inline int pbgo_loader_set_prefetch(pb_loader *l, int32_t batches, char **msg) {
	return pbgo_status(pb_loader_set_prefetch(l, batches), msg);
}

/* info: num_batches, num_records, corrupt_chunks. */
static inline int pbgo_loader_info(pb_loader *l, int64_t *info, char **msg) {
	int st = pb_loader_num_batches(l, &info[0]);
	if (st == PB_OK) st = pb_loader_num_records(l, &info[1]);
	if (st == PB_OK) st = pb_loader_corrupt_chunks(l, &info[2]);
	return pbgo_status(st, msg);
}

static inline int pbgo_loader_close(pb_loader *l, char **msg) {
	return pbgo_status(pb_loader_close(l), msg);
}

#endif /* PBGO_LOADER_H */
