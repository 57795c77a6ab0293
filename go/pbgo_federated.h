/*
 * pbgo_federated.h - the hand-written helpers between federated.go and the federated
 * training functions of pybridge.h: those that take a Go slice, described here on the C
 * stack (as in pbgo.h). The one-call trampolines are generated (pbgo_gen.h).
 */
#ifndef PBGO_FEDERATED_H
#define PBGO_FEDERATED_H

#include "pbgo.h"

static inline int pbgo_fed_server_start_round_slice(pb_fed_server *s, const int64_t *clients,
                                                    int64_t n, void *model, int64_t count,
                                                    int32_t dtype, int32_t command, char **msg) {
	pb_tensor t = pbgo_tensor(model, count, dtype);
	return pbgo_status(pb_fed_server_start_round(s, clients, n, &t, command), msg);
}

static inline int pbgo_fed_server_result_payload_slice(pb_fed_server *s, void *data, int64_t count,
                                                       int32_t dtype, char **msg) {
	pb_tensor t = pbgo_tensor(data, count, dtype);
	return pbgo_status(pb_fed_server_result_payload(s, &t), msg);
}

static inline int pbgo_fed_server_aggregate_slice(pb_fed_server *s, double lr, void *model,
                                                  int64_t count, int32_t dtype, int32_t *clients,
                                                  char **msg) {
	pb_tensor t = pbgo_tensor(model, count, dtype);
	return pbgo_status(pb_fed_server_aggregate(s, lr, &t, clients), msg);
}

static inline int pbgo_fed_worker_task_model_slice(pb_fed_worker *w, void *data, int64_t count,
                                                   int32_t dtype, char **msg) {
	pb_tensor t = pbgo_tensor(data, count, dtype);
	return pbgo_status(pb_fed_worker_task_model(w, &t), msg);
}

static inline int pbgo_fed_worker_submit_slice(pb_fed_worker *w, void *data, int64_t count,
                                               int32_t dtype, int64_t samples, char **msg) {
	pb_tensor t = pbgo_tensor(data, count, dtype);
	return pbgo_status(pb_fed_worker_submit(w, &t, samples), msg);
}

static inline int pbgo_fed_worker_submit_metrics_slice(pb_fed_worker *w, void *data, int64_t count,
                                                       int32_t dtype, int64_t samples, int32_t n,
                                                       const char *const *names, const double *values,
                                                       char **msg) {
	pb_tensor t = pbgo_tensor(data, count, dtype);
	return pbgo_status(pb_fed_worker_submit_metrics(w, &t, samples, n, names, values), msg);
}

#endif /* PBGO_FEDERATED_H */
