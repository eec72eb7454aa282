/*
 * dlpack_abi.h -- the few DLPack structures the binding reads, declared from
 * the DLPack ABI (v0.8 legacy capsule "dltensor" and v1 "dltensor_versioned").
 * They let the binding take torch (or JAX, CuPy...) tensors without linking
 * any of those libraries.
 */
#ifndef PLD_DLPACK_ABI_H
#define PLD_DLPACK_ABI_H

#include <stdint.h>

enum {
    PLD_DL_CPU = 1,
    PLD_DL_CUDA_HOST = 3
};

enum {
    PLD_DL_INT = 0,
    PLD_DL_UINT = 1,
    PLD_DL_FLOAT = 2,
    PLD_DL_BFLOAT = 4,
    PLD_DL_BOOL = 6
};

typedef struct {
    int32_t device_type;
    int32_t device_id;
} pld_dl_device;

typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} pld_dl_dtype;

typedef struct {
    void *data;
    pld_dl_device device;
    int32_t ndim;
    pld_dl_dtype dtype;
    int64_t *shape;
    int64_t *strides; /* in elements; NULL means compact row-major */
    uint64_t byte_offset;
} pld_dl_tensor;

typedef struct pld_dl_managed {
    pld_dl_tensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct pld_dl_managed *self);
} pld_dl_managed;

typedef struct pld_dl_managed_versioned {
    uint32_t version_major;
    uint32_t version_minor;
    void *manager_ctx;
    void (*deleter)(struct pld_dl_managed_versioned *self);
    uint64_t flags;
    pld_dl_tensor dl_tensor;
} pld_dl_managed_versioned;

/* flags of a versioned tensor: the consumer must not write to it */
#define PLD_DL_FLAG_READ_ONLY ((uint64_t)1 << 0)

#endif /* PLD_DLPACK_ABI_H */
