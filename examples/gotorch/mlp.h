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

/* Called from the autograd engine as soon as parameter `index`'s gradient is
 * complete (after it was accumulated into the grad tensor): torch DDP's
 * post-accumulate-grad hook. A non-zero return is kept as the hook error and
 * reported by mlp_forward_backward. Signature-compatible with
 * pb_reducer_mark_ready, so the reducer handle can be the context. */
typedef int (*mlp_ready_fn)(void *ctx, int32_t index);

const char *mlp_last_error(void);

/* A new model on `device` (-1 CPU, k >= 0 CUDA device k). */
int mlp_new(int32_t inputs, int32_t hidden, int32_t classes, int64_t seed, int32_t device, mlp **out);
void mlp_free(mlp *m);

/* The number of parameters (4: w1, b1, w2, b2, torch.nn.Linear's layout). */
int32_t mlp_nparams(const mlp *m);

/* Parameter i: its data pointer (host or device memory), element count and shape
 * (ndim <= 2 entries of dims). The pointer stays valid for the model's life. */
int mlp_param(mlp *m, int32_t i, void **data, int64_t *count, int32_t *ndim, int64_t *dims);

/* Make parameter i's gradient a view of `data` (count elements of float32 on the
 * model's device, owned by the caller: a reducer's bucket), so backward
 * accumulates into it in place. NULL: the gradient becomes undefined again. */
int mlp_set_grad_view(mlp *m, int32_t i, void *data);

/* Parameter i's gradient: its data pointer (NULL when it has none). */
int mlp_grad(mlp *m, int32_t i, void **data);

/* Call fn(ctx, i) when parameter i's gradient is complete (NULL: no hook). */
int mlp_on_grad_ready(mlp *m, mlp_ready_fn fn, void *ctx);

/* Zero every defined gradient in place (the views stay views). */
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
