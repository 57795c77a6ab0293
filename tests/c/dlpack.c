/* DLPack from plain C, compiled against the torch wheel's dlpack.h (ATen/dlpack.h):
 * describe a producer's tensor with pb_tensor_from_dlpack(_versioned) and allreduce it in
 * place on a group of one; unsupported tensors are refused by name.
 * Usage: dlpack <tcp port>. Prints one line per check; exits 1 if any failed. */
#include <stdio.h>
#include <string.h>
#include "dlpack.h"
#include "pybridge.h"
#include "expect.h"

static void check(const char *what, int ok) {
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    failures += !ok;
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: %s PORT\n", argv[0]); return 2; }
    char url[64];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%s", argv[1]);
    float data[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    int64_t shape[2] = {2, 3};
    int64_t transposed[2] = {1, 3};
    DLManagedTensor m;
    memset(&m, 0, sizeof m);
    m.dl_tensor.data = data;
    m.dl_tensor.device.device_type = kDLCPU;
    m.dl_tensor.ndim = 2;
    m.dl_tensor.dtype.code = kDLFloat;
    m.dl_tensor.dtype.bits = 32;
    m.dl_tensor.dtype.lanes = 1;
    m.dl_tensor.shape = shape;
    m.dl_tensor.byte_offset = 2 * sizeof(float); /* the tensor starts at data[2] */
    pb_tensor t;
    pb_group *g = NULL;

    expect("init", pb_init(url, "gloo", 0, 1, 0, 10, &g), PB_OK, NULL);
    if (failures) return 1;
    expect("from_dlpack", pb_tensor_from_dlpack(&m, &t), PB_OK, NULL);
    check("data is data + byte_offset", t.data == &data[2]);
    check("count is the shape's product", t.count == 6);
    check("dtype and device", t.dtype == PB_FLOAT32 && t.device == PB_CPU);
    expect("all_reduce on the producer's memory", pb_all_reduce(g, &t, PB_MAX), PB_OK, NULL);
    check("values kept in place", data[2] == 2 && data[7] == 7 && data[0] == 0);

    m.dl_tensor.strides = transposed;
    expect("non-contiguous strides", pb_tensor_from_dlpack(&m, &t), PB_ERR_INVALID_ARGUMENT, "not contiguous");
    m.dl_tensor.strides = NULL;
    m.dl_tensor.dtype.code = kDLComplex;
    m.dl_tensor.dtype.bits = 64;
    expect("complex dtype", pb_tensor_from_dlpack(&m, &t), PB_ERR_INVALID_ARGUMENT, "kDLComplex");
    m.dl_tensor.dtype.code = kDLFloat;
    m.dl_tensor.dtype.bits = 32;
    m.dl_tensor.device.device_type = kDLMetal;
    expect("Metal device", pb_tensor_from_dlpack(&m, &t), PB_ERR_INVALID_ARGUMENT, "kDLMetal");
    m.dl_tensor.device.device_type = kDLCUDA;
    expect("CUDA device without CUDA", pb_tensor_from_dlpack(&m, &t), PB_ERR_INVALID_ARGUMENT, "CUDA");
    expect("NULL tensor", pb_tensor_from_dlpack(NULL, &t), PB_ERR_INVALID_ARGUMENT, "NULL");

    DLManagedTensorVersioned v;
    memset(&v, 0, sizeof v);
    v.version.major = DLPACK_MAJOR_VERSION;
    v.version.minor = DLPACK_MINOR_VERSION;
    v.dl_tensor = m.dl_tensor;
    v.dl_tensor.device.device_type = kDLCPU;
    expect("versioned", pb_tensor_from_dlpack_versioned(&v, &t), PB_OK, NULL);
    check("versioned count", t.count == 6 && t.data == &data[2]);
    v.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
    expect("read-only", pb_tensor_from_dlpack_versioned(&v, &t), PB_ERR_INVALID_ARGUMENT, "read-only");

    expect("finalize", pb_finalize(g), PB_OK, NULL);
    printf("dlpack: %d failed checks\n", failures);
    return failures ? 1 : 0;
}
