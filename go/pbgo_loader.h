/*
 * pbgo_loader.h - the hand-written helpers between loader.go and the RecordIO loader of
 * pybridge.h; the one-call trampolines (pbgo_loader_open, ...) are generated (pbgo_gen.h).
 */
#ifndef PBGO_LOADER_H
#define PBGO_LOADER_H

#include "pbgo.h"

/* info: num_batches, num_records, corrupt_chunks. */
static inline int pbgo_loader_info(pb_loader *l, int64_t *info, char **msg) {
	int st = pb_loader_num_batches(l, &info[0]);
	if (st == PB_OK) st = pb_loader_num_records(l, &info[1]);
	if (st == PB_OK) st = pb_loader_corrupt_chunks(l, &info[2]);
	return pbgo_status(st, msg);
}

#endif /* PBGO_LOADER_H */
