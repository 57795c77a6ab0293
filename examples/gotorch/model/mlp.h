/*
 * mlp.h - a small C interface over libtorch for the GoTorch-style trainer:
 * Go -> this C wrapper -> libtorch (ATen and autograd), as GoTorch is built.
 *
 * The model is the MNIST 784-H-10 MLP of examples/mnist (ReLU, softmax
 * cross-entropy, SGD with torch's momentum), its parameters created by
 * torch::nn::Linear after torch::manual_seed(seed), which draws the same numbers
 * as Python's torch.nn.Linear after torch.manual_seed(seed).
 *
 * Every function returns 0 or -1; after -1, mlp_last_error() says why (the
 * calling thread's message, valid until its next failing call).
 */
#ifndef GOTORCH_MLP_H
#define GOTORCH_MLP_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mlp mlp;

const char *mlp_last_error(void);

/* A new model on `device` (-1 CPU, k >= 0 CUDA device k). */
int mlp_new(int32_t inputs, int32_t hidden, int32_t classes, int64_t seed, int32_t device, mlp **out);
void mlp_free(mlp *m);

/* The number of parameters (4: w1, b1, w2, b2, torch.nn.Linear's layout). */
int32_t mlp_nparams(const mlp *m);

/* Parameter i: its data pointer (host or device memory), element count and shape
 * (ndim <= 2 entries of dims). The pointer stays valid for the model's life. */
int mlp_param(mlp *m, int32_t i, void **data, int64_t *count, int32_t *ndim, int64_t *dims);

/* Parameter i as libtorch's own tensor: *tensor is its at::Tensor*, owned by the
 * model, valid for the model's life (what pybridge.TorchTensor takes). */
int mlp_param_handle(mlp *m, int32_t i, void **tensor);

/* Parameter i's gradient as an at::Tensor* (NULL while it has none), valid until
 * the gradient is replaced (mlp_zero_grad, or a backward after it). */
int mlp_grad_handle(mlp *m, int32_t i, void **tensor);

/* Parameter i's gradient: its data pointer (NULL when it has none). */
int mlp_grad(mlp *m, int32_t i, void **data);

/* Drop every gradient (libtorch's zero_grad, which sets them to None by default):
 * the next backward makes fresh ones. */
int mlp_zero_grad(mlp *m);

/* Forward and backward on a batch of `n` records of `inputs` uint8 pixels
 * (scaled by 1/255) and labels; *loss receives the mean cross-entropy and
 * *correct the number of right predictions. Gradients accumulate. */
int mlp_forward_backward(mlp *m, const uint8_t *pixels, const uint8_t *labels, int32_t n, float *loss,
                         int32_t *correct);

/* Predictions for n records (no gradients): the number of right ones in *correct. */
int mlp_evaluate(mlp *m, const uint8_t *pixels, const uint8_t *labels, int32_t n, int32_t *correct);

/* One SGD step with torch.optim.SGD's momentum (buf = momentum * buf + grad; p -= lr * buf). */
int mlp_sgd_step(mlp *m, float lr, float momentum);

/* Copy parameter i (momentum 0) or its momentum buffer (momentum 1) into out (its
 * element count of float32, host memory), from either device. *defined is 0 for a
 * momentum buffer before the first step (out untouched), else 1. */
int mlp_copy_to_host(mlp *m, int32_t i, int32_t momentum, float *out, int32_t *defined);

/* Wait for the device's queued work (CUDA); a no-op on CPU. */
int mlp_synchronize(mlp *m);

#ifdef __cplusplus
}
#endif

#endif
