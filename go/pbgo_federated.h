/*
 * pbgo_federated.h - static helpers between federated.go and the federated training
 * functions of pybridge.h. As in pbgo.h, each helper copies pb_last_error() in the same
 * cgo call as the failing library call, and builds tensor descriptors on the C stack.
 */
#ifndef PBGO_FEDERATED_H
#define PBGO_FEDERATED_H

#include "pbgo.h"

static inline int pbgo_fed_server_new(pb_group *g, int32_t mode, double timeout_seconds,
                                      int32_t requeue, pb_fed_server **out, char **msg) {
	return pbgo_status(pb_fed_server_new(g, mode, timeout_seconds, requeue, out), msg);
}

static inline int pbgo_fed_server_start_round(pb_fed_server *s, const int64_t *clients, int64_t n,
                                              void *model, int64_t count, int32_t dtype,
                                              int32_t command, char **msg) {
	pb_tensor t = pbgo_tensor(model, count, dtype);
	return pbgo_status(pb_fed_server_start_round(s, clients, n, &t, command), msg);
}

static inline int pbgo_fed_server_next_result(pb_fed_server *s, pb_fed_result *out, int32_t *has,
                                              char **msg) {
	return pbgo_status(pb_fed_server_next_result(s, out, has), msg);
}

static inline int pbgo_fed_server_result_payload(pb_fed_server *s, void *data, int64_t count,
                                                 int32_t dtype, char **msg) {
	pb_tensor t = pbgo_tensor(data, count, dtype);
	return pbgo_status(pb_fed_server_result_payload(s, &t), msg);
}

static inline int pbgo_fed_server_aggregate(pb_fed_server *s, double lr, void *model, int64_t count,
                                            int32_t dtype, int32_t *clients, char **msg) {
	pb_tensor t = pbgo_tensor(model, count, dtype);
	return pbgo_status(pb_fed_server_aggregate(s, lr, &t, clients), msg);
}

static inline int pbgo_fed_server_close(pb_fed_server *s, char **msg) {
	return pbgo_status(pb_fed_server_close(s), msg);
}

static inline int pbgo_fed_worker_new(pb_group *g, pb_fed_worker **out, char **msg) {
	return pbgo_status(pb_fed_worker_new(g, out), msg);
}

static inline int pbgo_fed_worker_next_task(pb_fed_worker *w, pb_fed_task *task, int32_t *has,
                                            char **msg) {
	return pbgo_status(pb_fed_worker_next_task(w, task, has), msg);
}

static inline int pbgo_fed_worker_task_model(pb_fed_worker *w, void *data, int64_t count,
                                             int32_t dtype, char **msg) {
	pb_tensor t = pbgo_tensor(data, count, dtype);
	return pbgo_status(pb_fed_worker_task_model(w, &t), msg);
}

static inline int pbgo_fed_worker_submit(pb_fed_worker *w, void *data, int64_t count, int32_t dtype,
                                         int64_t samples, char **msg) {
	pb_tensor t = pbgo_tensor(data, count, dtype);
	return pbgo_status(pb_fed_worker_submit(w, &t, samples), msg);
}

static inline int pbgo_fed_worker_fail(pb_fed_worker *w, const char *message, char **msg) {
	return pbgo_status(pb_fed_worker_fail(w, message), msg);
}

static inline int pbgo_fed_worker_free(pb_fed_worker *w, char **msg) {
	return pbgo_status(pb_fed_worker_free(w), msg);
}

#endif /* PBGO_FEDERATED_H */
