/*
 * pld_module.c -- the CPython binding of the pld core (module pld._core).
 *
 * The only file that talks to Python. It turns Python objects into
 * (pointer, length) views without copying where it can -- the buffer
 * protocol (NumPy, array.array, memoryview), DLPack (torch and friends,
 * without linking them), or a copy for lists and strided inputs -- calls the
 * core, and turns the answer back into Python objects.
 *
 * Sections: views of arrays | token inputs | float inputs | small parsers |
 * find_candidate | NgramIndex | acceptance | Generator | module.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dlpack_abi.h"
#include "pld.h"

/* Inputs longer than this are scanned with the GIL released. */
#define PLD_NOGIL_MIN_ELEMENTS ((size_t)1 << 15)
/* num_pred_tokens beyond this is certainly a mistake. */
#define PLD_MAX_DRAFT ((Py_ssize_t)1 << 20)

/* ========================================================= views of arrays */

typedef struct {
    char *data;
    int ndim;
    Py_ssize_t shape[3];
    Py_ssize_t strides[3]; /* bytes */
    char kind;             /* 'i' signed, 'u' unsigned, 'f' float, 'b' bfloat16, 'x' other */
    int itemsize;
    const char *type_name; /* for messages */
    Py_buffer view;
    int has_view;
    PyObject *capsule;
    int read_only;         /* a DLPack v1 producer marked the memory read-only */
} array_view;

static void array_view_release(array_view *av)
{
    if (av->has_view) {
        PyBuffer_Release(&av->view);
        av->has_view = 0;
    }
    Py_CLEAR(av->capsule);
}

static const char *buffer_kind(const char *fmt, int itemsize, char *kind)
{
    char c;
    if (fmt == NULL)
        fmt = "B";
    if (*fmt == '@' || *fmt == '=' || *fmt == '<')
        fmt++;
    else if (*fmt == '>' || *fmt == '!')
        return NULL; /* big-endian data */
    if (fmt[0] == '\0' || fmt[1] != '\0')
        return NULL;
    c = fmt[0];
    if (strchr("bhilqn", c)) {
        *kind = 'i';
        return itemsize == 1 ? "int8" : itemsize == 2 ? "int16" : itemsize == 4 ? "int32" : "int64";
    }
    if (strchr("BHILQN", c)) {
        *kind = 'u';
        return itemsize == 1 ? "uint8" : itemsize == 2 ? "uint16" : itemsize == 4 ? "uint32" : "uint64";
    }
    if (c == 'e' || c == 'f' || c == 'd') {
        *kind = 'f';
        return itemsize == 2 ? "float16" : itemsize == 4 ? "float32" : "float64";
    }
    if (c == '?') {
        *kind = 'x';
        return "bool";
    }
    return NULL;
}

/* writable: ask for a buffer the caller may write to (a read-only one is
 * then a ValueError that says so). */
static int view_from_buffer(PyObject *obj, const char *arg, array_view *av, int writable)
{
    int i;
    if (PyObject_GetBuffer(obj, &av->view, writable ? PyBUF_RECORDS : PyBUF_RECORDS_RO) < 0) {
        int read_only = 0;
        PyErr_Clear();
        if (writable && PyObject_GetBuffer(obj, &av->view, PyBUF_RECORDS_RO) == 0) {
            PyBuffer_Release(&av->view);
            read_only = 1;
        } else {
            PyErr_Clear();
        }
        if (read_only)
            PyErr_Format(PyExc_ValueError, "%s: the %.100s is read-only", arg,
                         Py_TYPE(obj)->tp_name);
        else
            PyErr_Format(PyExc_TypeError,
                         "%s: the %.100s buffer cannot be %s as a typed array",
                         arg, Py_TYPE(obj)->tp_name, writable ? "written" : "read");
        return -1;
    }
    av->has_view = 1;
    av->itemsize = (int)av->view.itemsize;
    av->type_name = buffer_kind(av->view.format, av->itemsize, &av->kind);
    if (av->type_name == NULL) {
        PyErr_Format(PyExc_TypeError,
                     "%s: unsupported element format '%s' (expected native integers or floats)",
                     arg, av->view.format ? av->view.format : "B");
        return -1;
    }
    if (av->view.ndim > 3) {
        PyErr_Format(PyExc_ValueError, "%s: expected at most 3 dimensions, got %d",
                     arg, av->view.ndim);
        return -1;
    }
    av->ndim = av->view.ndim;
    av->data = av->view.buf;
    for (i = 0; i < av->ndim; i++) {
        av->shape[i] = av->view.shape ? av->view.shape[i] : av->view.len / av->view.itemsize;
        av->strides[i] = av->view.strides ? av->view.strides[i] : av->itemsize;
    }
    return 0;
}

static int view_from_dlpack(PyObject *obj, const char *arg, array_view *av)
{
    pld_dl_tensor *t;
    int i;
    av->capsule = PyObject_CallMethod(obj, "__dlpack__", NULL);
    if (av->capsule == NULL) {
        /* the producer refused (a meta tensor, one that requires grad...):
         * a ValueError naming the argument, the producer's error as cause */
        PyObject *type, *cause, *tb, *type2, *value2, *tb2;
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return -1;
        PyErr_Fetch(&type, &cause, &tb);
        PyErr_NormalizeException(&type, &cause, &tb);
        if (tb != NULL)
            PyException_SetTraceback(cause, tb);
        PyErr_Format(PyExc_ValueError, "%s: the %.100s cannot be read through DLPack: %S",
                     arg, Py_TYPE(obj)->tp_name, cause);
        PyErr_Fetch(&type2, &value2, &tb2);
        PyErr_NormalizeException(&type2, &value2, &tb2);
        PyException_SetCause(value2, cause); /* steals cause */
        PyErr_Restore(type2, value2, tb2);
        Py_XDECREF(type);
        Py_XDECREF(tb);
        return -1;
    }
    if (PyCapsule_IsValid(av->capsule, "dltensor")) {
        pld_dl_managed *m = PyCapsule_GetPointer(av->capsule, "dltensor");
        t = &m->dl_tensor;
    } else if (PyCapsule_IsValid(av->capsule, "dltensor_versioned")) {
        pld_dl_managed_versioned *m =
            PyCapsule_GetPointer(av->capsule, "dltensor_versioned");
        if (m->version_major != 1) {
            PyErr_Format(PyExc_TypeError, "%s: unsupported DLPack version %u",
                         arg, (unsigned)m->version_major);
            return -1;
        }
        t = &m->dl_tensor;
        av->read_only = (m->flags & PLD_DL_FLAG_READ_ONLY) != 0;
    } else {
        PyErr_Format(PyExc_TypeError, "%s: __dlpack__ did not return a DLPack capsule", arg);
        return -1;
    }
    if (t->device.device_type != PLD_DL_CPU && t->device.device_type != PLD_DL_CUDA_HOST) {
        PyErr_Format(PyExc_ValueError,
                     "%s: expected a tensor in CPU memory, got one on DLPack device type %d "
                     "(copy it to the CPU first)",
                     arg, (int)t->device.device_type);
        return -1;
    }
    if (t->ndim < 0 || t->ndim > 3) {
        PyErr_Format(PyExc_ValueError, "%s: expected at most 3 dimensions, got %d",
                     arg, (int)t->ndim);
        return -1;
    }
    av->itemsize = t->dtype.bits / 8;
    switch (t->dtype.code) {
    case PLD_DL_INT:
        av->kind = 'i';
        av->type_name = av->itemsize == 8 ? "int64" : av->itemsize == 4 ? "int32" : av->itemsize == 2 ? "int16" : "int8";
        break;
    case PLD_DL_UINT:
        av->kind = 'u';
        av->type_name = av->itemsize == 8 ? "uint64" : av->itemsize == 4 ? "uint32" : av->itemsize == 2 ? "uint16" : "uint8";
        break;
    case PLD_DL_FLOAT:
        av->kind = 'f';
        av->type_name = av->itemsize == 2 ? "float16" : av->itemsize == 4 ? "float32" : "float64";
        break;
    case PLD_DL_BFLOAT:
        av->kind = 'b';
        av->type_name = "bfloat16";
        break;
    case PLD_DL_BOOL:
        av->kind = 'x';
        av->type_name = "bool";
        break;
    default:
        av->kind = 'x';
        av->type_name = "an unsupported dtype";
    }
    if (t->dtype.lanes != 1 || t->dtype.bits % 8 != 0 || av->itemsize == 0 || av->itemsize > 8) {
        av->kind = 'x';
        av->type_name = "an unsupported dtype";
    }
    av->ndim = t->ndim;
    av->data = (char *)t->data + t->byte_offset;
    {
        Py_ssize_t step = av->itemsize;
        for (i = av->ndim - 1; i >= 0; i--) {
            av->shape[i] = (Py_ssize_t)t->shape[i];
            av->strides[i] = t->strides ? (Py_ssize_t)t->strides[i] * av->itemsize : step;
            step *= av->shape[i] > 0 ? av->shape[i] : 1;
        }
    }
    return 0;
}

/* 1: obj is an array and av is filled; 0: not an array; -1: error (av may
 * hold a view all the same: release it). writable: the caller will write to
 * the memory, so a read-only one is an error. For reading, text and bytes are
 * refused here: their bytes would pass for uint8 ids. */
static int array_view_get(PyObject *obj, const char *arg, array_view *av, int writable)
{
    memset(av, 0, sizeof(*av));
    if (!writable && (PyUnicode_Check(obj) || PyBytes_Check(obj) || PyByteArray_Check(obj))) {
        PyErr_Format(PyExc_TypeError,
                     "%s: expected token ids or an array, got %.100s",
                     arg, Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (PyObject_CheckBuffer(obj))
        return view_from_buffer(obj, arg, av, writable) < 0 ? -1 : 1;
    if (!PyType_Check(obj) && PyObject_HasAttrString(obj, "__dlpack__")) {
        if (view_from_dlpack(obj, arg, av) < 0)
            return -1;
        if (writable && av->read_only) {
            PyErr_Format(PyExc_ValueError, "%s: the %.100s is read-only", arg,
                         Py_TYPE(obj)->tp_name);
            return -1;
        }
        return 1;
    }
    return 0;
}

/* ============================================================ token inputs */

typedef struct {
    const void *data; /* int32 (is32) or int64 elements, contiguous */
    int is32;
    size_t len;
    array_view av;
    int64_t *owned;
    int64_t scalar;
} token_input;

static void token_input_release(token_input *ti)
{
    array_view_release(&ti->av);
    PyMem_Free(ti->owned);
    ti->owned = NULL;
}

static int token_from_pyint(PyObject *item, const char *arg, int64_t *out)
{
    int overflow = 0;
    long long v;
    PyObject *index;
    if (PyFloat_Check(item) || !PyIndex_Check(item)) {
        PyErr_Format(PyExc_TypeError, "%s: expected int token ids, got %.100s",
                     arg, Py_TYPE(item)->tp_name);
        return -1;
    }
    index = PyNumber_Index(item);
    if (index == NULL)
        return -1;
    v = PyLong_AsLongLongAndOverflow(index, &overflow);
    Py_DECREF(index);
    if (overflow) {
        PyErr_Format(PyExc_ValueError, "%s: token id does not fit in int64", arg);
        return -1;
    }
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = (int64_t)v;
    return 0;
}

static int tokens_from_array(token_input *ti, const char *arg)
{
    array_view *av = &ti->av;
    Py_ssize_t n, stride, i;
    if (av->kind != 'i' && av->kind != 'u') {
        PyErr_Format(PyExc_TypeError, "%s: expected integer token ids, got %s elements",
                     arg, av->type_name);
        return -1;
    }
    if (av->ndim == 1) {
        n = av->shape[0];
        stride = av->strides[0];
    } else if (av->ndim == 2) {
        if (av->shape[0] != 1) {
            PyErr_Format(PyExc_ValueError,
                         "%s: batch size %zd is not supported (expected shape [1, L] or [L])",
                         arg, av->shape[0]);
            return -1;
        }
        n = av->shape[1];
        stride = av->strides[1];
    } else {
        PyErr_Format(PyExc_ValueError,
                     "%s: expected a 1-D [L] or 2-D [1, L] array, got %d dimensions",
                     arg, av->ndim);
        return -1;
    }
    ti->len = (size_t)n;
    if (av->kind == 'i' && (av->itemsize == 8 || av->itemsize == 4) &&
        (stride == av->itemsize || n <= 1)) {
        ti->data = av->data;
        ti->is32 = av->itemsize == 4;
        return 0;
    }
    ti->owned = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    if (ti->owned == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (i = 0; i < n; i++) {
        const char *p = av->data + i * stride;
        int64_t v;
        if (av->kind == 'i') {
            switch (av->itemsize) {
            case 1: v = *(const int8_t *)p; break;
            case 2: { int16_t x; memcpy(&x, p, 2); v = x; break; }
            case 4: { int32_t x; memcpy(&x, p, 4); v = x; break; }
            default: memcpy(&v, p, 8);
            }
        } else {
            uint64_t u;
            switch (av->itemsize) {
            case 1: u = *(const uint8_t *)p; break;
            case 2: { uint16_t x; memcpy(&x, p, 2); u = x; break; }
            case 4: { uint32_t x; memcpy(&x, p, 4); u = x; break; }
            default: memcpy(&u, p, 8);
            }
            if (u > (uint64_t)INT64_MAX) {
                PyErr_Format(PyExc_ValueError, "%s: token id %llu does not fit in int64",
                             arg, (unsigned long long)u);
                return -1;
            }
            v = (int64_t)u;
        }
        ti->owned[i] = v;
    }
    ti->data = ti->owned;
    ti->is32 = 0;
    return 0;
}

static int tokens_from_sequence(PyObject *obj, token_input *ti, const char *arg)
{
    PyObject *fast = NULL, *row = NULL;
    Py_ssize_t n, i;
    int rc = -1;
    fast = PySequence_Check(obj) ? PySequence_Fast(obj, "") : NULL;
    if (fast == NULL) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError,
                     "%s: expected a tensor, an integer array or a sequence of ints, got %.100s",
                     arg, Py_TYPE(obj)->tp_name);
        return -1;
    }
    n = PySequence_Fast_GET_SIZE(fast);
    if (n > 0 && (PyList_Check(PySequence_Fast_GET_ITEM(fast, 0)) ||
                  PyTuple_Check(PySequence_Fast_GET_ITEM(fast, 0)))) {
        if (n != 1) {
            PyErr_Format(PyExc_ValueError,
                         "%s: batch size %zd is not supported (expected one row)", arg, n);
            goto error;
        }
        row = PySequence_Fast(PySequence_Fast_GET_ITEM(fast, 0), "");
        if (row == NULL)
            goto error;
        Py_SETREF(fast, row);
        row = NULL;
        n = PySequence_Fast_GET_SIZE(fast);
    }
    ti->owned = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    if (ti->owned == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    for (i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        if (PyLong_CheckExact(item)) {
            int overflow = 0;
            long long v = PyLong_AsLongLongAndOverflow(item, &overflow);
            if (overflow) {
                PyErr_Format(PyExc_ValueError, "%s: token id does not fit in int64", arg);
                goto error;
            }
            ti->owned[i] = (int64_t)v;
        } else if (token_from_pyint(item, arg, &ti->owned[i]) < 0) {
            goto error;
        }
    }
    ti->data = ti->owned;
    ti->len = (size_t)n;
    rc = 0;
error:
    Py_XDECREF(fast);
    return rc;
}

/* Fill ti from a tensor, array, buffer, sequence or (allow_scalar) an int. */
static int token_input_get(PyObject *obj, const char *arg, int allow_scalar,
                           token_input *ti)
{
    int got;
    memset(ti, 0, sizeof(*ti));
    if (obj == Py_None) {
        PyErr_Format(PyExc_TypeError, "%s: expected token ids, got None", arg);
        return -1;
    }
    if (allow_scalar && PyLong_Check(obj)) {
        if (token_from_pyint(obj, arg, &ti->scalar) < 0)
            return -1;
        ti->data = &ti->scalar;
        ti->len = 1;
        return 0;
    }
    got = array_view_get(obj, arg, &ti->av, 0);
    if (got > 0)
        got = tokens_from_array(ti, arg);
    else if (got == 0)
        got = tokens_from_sequence(obj, ti, arg);
    if (got < 0) {
        token_input_release(ti);
        return -1;
    }
    return 0;
}

/* ============================================================ float inputs */

typedef struct {
    const void *data; /* rows x vocab, C order */
    pld_float_type ftype;
    size_t rows, vocab;
    array_view av;
    void *owned;
} float_input;

static void float_input_release(float_input *fi)
{
    array_view_release(&fi->av);
    PyMem_Free(fi->owned);
    fi->owned = NULL;
}

/* A [rows, V] or [1, rows, V] float32/float16/bfloat16 array. */
static int float_input_get(PyObject *obj, const char *arg, float_input *fi)
{
    array_view *av = &fi->av;
    int got, r0;
    Py_ssize_t rows, vocab, rs, vs, r, v;
    memset(fi, 0, sizeof(*fi));
    if (obj == Py_None) {
        PyErr_Format(PyExc_TypeError, "%s: expected a float array, got None", arg);
        return -1;
    }
    got = array_view_get(obj, arg, av, 0);
    if (got < 0) {
        array_view_release(av);
        return -1;
    }
    if (got == 0) {
        PyErr_Format(PyExc_TypeError,
                     "%s: expected a tensor or array of shape [k+1, V], got %.100s",
                     arg, Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (av->kind == 'f' && av->itemsize == 4)
        fi->ftype = PLD_F32;
    else if (av->kind == 'f' && av->itemsize == 2)
        fi->ftype = PLD_F16;
    else if (av->kind == 'b')
        fi->ftype = PLD_BF16;
    else {
        PyErr_Format(PyExc_TypeError,
                     "%s: expected float32, float16 or bfloat16 elements, got %s",
                     arg, av->type_name);
        return -1;
    }
    if (av->ndim == 3 && av->shape[0] != 1) {
        PyErr_Format(PyExc_ValueError,
                     "%s: batch size %zd is not supported (expected [1, k+1, V] or [k+1, V])",
                     arg, av->shape[0]);
        return -1;
    }
    if (av->ndim != 2 && av->ndim != 3) {
        PyErr_Format(PyExc_ValueError, "%s: expected shape [k+1, V] or [1, k+1, V], got %d dimensions",
                     arg, av->ndim);
        return -1;
    }
    r0 = av->ndim - 2;
    rows = av->shape[r0];
    vocab = av->shape[r0 + 1];
    rs = av->strides[r0];
    vs = av->strides[r0 + 1];
    if (vocab < 1) {
        PyErr_Format(PyExc_ValueError, "%s: the vocabulary dimension is empty", arg);
        return -1;
    }
    fi->rows = (size_t)rows;
    fi->vocab = (size_t)vocab;
    if (vs == av->itemsize && (rs == vocab * av->itemsize || rows <= 1)) {
        fi->data = av->data;
        return 0;
    }
    fi->owned = PyMem_Malloc((size_t)(rows > 0 ? rows : 1) * (size_t)vocab * av->itemsize);
    if (fi->owned == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (r = 0; r < rows; r++)
        for (v = 0; v < vocab; v++)
            memcpy((char *)fi->owned + (r * vocab + v) * av->itemsize,
                   av->data + r * rs + v * vs, (size_t)av->itemsize);
    fi->data = fi->owned;
    return 0;
}

/* =========================================================== small parsers */

static int parse_size(PyObject *obj, const char *arg, Py_ssize_t min, Py_ssize_t max,
                      size_t *out)
{
    Py_ssize_t v;
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, got %.100s", arg,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    v = PyLong_AsSsize_t(obj);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s is out of range", arg);
        return -1;
    }
    if (v < min || v > max) {
        PyErr_Format(PyExc_ValueError, "%s must be between %zd and %zd, got %zd", arg,
                     min, max, v);
        return -1;
    }
    *out = (size_t)v;
    return 0;
}

static int parse_semantics(PyObject *obj, pld_semantics *out)
{
    if (obj == NULL || obj == Py_None) {
        *out = PLD_SEED;
        return 0;
    }
    if (PyUnicode_Check(obj)) {
        if (PyUnicode_CompareWithASCIIString(obj, "seed") == 0) {
            *out = PLD_SEED;
            return 0;
        }
        if (PyUnicode_CompareWithASCIIString(obj, "transformers") == 0) {
            *out = PLD_TRANSFORMERS;
            return 0;
        }
    }
    PyErr_Format(PyExc_ValueError, "semantics must be 'seed' or 'transformers', got %R", obj);
    return -1;
}

/* Lookup options owned by the binding: eos ids are copied. */
typedef struct {
    pld_lookup_opts opts;
    int64_t eos_small[8];
    int64_t *eos_heap;
} opts_holder;

static void opts_release(opts_holder *oh)
{
    PyMem_Free(oh->eos_heap);
    oh->eos_heap = NULL;
}

static int parse_opts(PyObject *semantics, PyObject *max_length, PyObject *eos,
                      opts_holder *oh)
{
    memset(oh, 0, sizeof(*oh));
    oh->opts.max_length = -1;
    if (parse_semantics(semantics, &oh->opts.semantics) < 0)
        return -1;
    if (max_length != NULL && max_length != Py_None) {
        long long v;
        if (oh->opts.semantics != PLD_TRANSFORMERS) {
            PyErr_SetString(PyExc_ValueError,
                            "max_length applies only with semantics='transformers'");
            return -1;
        }
        if (!PyLong_Check(max_length)) {
            PyErr_Format(PyExc_TypeError, "max_length must be an int or None, got %.100s",
                         Py_TYPE(max_length)->tp_name);
            return -1;
        }
        v = PyLong_AsLongLong(max_length);
        if (v == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            v = -1;
        }
        if (v < 0) {
            PyErr_SetString(PyExc_ValueError, "max_length must be an int in [0, 2**63)");
            return -1;
        }
        oh->opts.max_length = (int64_t)v;
    }
    if (eos != NULL && eos != Py_None) {
        token_input ti;
        size_t i;
        if (oh->opts.semantics != PLD_TRANSFORMERS) {
            PyErr_SetString(PyExc_ValueError,
                            "eos_token_id applies only with semantics='transformers'");
            return -1;
        }
        if (token_input_get(eos, "eos_token_id", 1, &ti) < 0)
            return -1;
        if (ti.len > 8) {
            oh->eos_heap = PyMem_Malloc(ti.len * sizeof(int64_t));
            if (oh->eos_heap == NULL) {
                token_input_release(&ti);
                PyErr_NoMemory();
                return -1;
            }
        }
        {
            int64_t *dst = oh->eos_heap ? oh->eos_heap : oh->eos_small;
            for (i = 0; i < ti.len; i++)
                dst[i] = ti.is32 ? ((const int32_t *)ti.data)[i] : ((const int64_t *)ti.data)[i];
            oh->opts.eos = dst;
            oh->opts.n_eos = ti.len;
        }
        token_input_release(&ti);
    }
    return 0;
}

static PyObject *list_from_i64(const int64_t *v, size_t n)
{
    PyObject *list = PyList_New((Py_ssize_t)n);
    size_t i;
    if (list == NULL)
        return NULL;
    for (i = 0; i < n; i++) {
        PyObject *item = PyLong_FromLongLong(v[i]);
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    return list;
}

static PyObject *raise_status(pld_status st, const char *what)
{
    switch (st) {
    case PLD_ERR_NOMEM:
        return PyErr_NoMemory();
    case PLD_ERR_OVERFLOW:
        PyErr_Format(PyExc_ValueError, "%s: too many tokens (at most %zu)", what,
                     (size_t)PLD_INDEX_MAX_TOKENS);
        return NULL;
    case PLD_ERR_VALUE:
        PyErr_Format(PyExc_ValueError,
                     "%s: every row must be finite and non-negative with positive mass", what);
        return NULL;
    default:
        PyErr_Format(PyExc_ValueError, "%s: invalid arguments", what);
        return NULL;
    }
}

/* Keyword/positional parsing for FASTCALL methods: fills out[i] (borrowed,
 * NULL when absent) from the names in `names`. */
static int parse_fast_args(const char *fname, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames, const char *const *names, int n_names,
                           int n_positional, PyObject **out)
{
    Py_ssize_t i;
    int j;
    for (j = 0; j < n_names; j++)
        out[j] = NULL;
    if (nargs > n_positional) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d positional arguments (%zd given)",
                     fname, n_positional, nargs);
        return -1;
    }
    for (i = 0; i < nargs; i++)
        out[i] = args[i];
    if (kwnames == NULL)
        return 0;
    for (i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, i);
        for (j = 0; j < n_names; j++)
            if (PyUnicode_CompareWithASCIIString(key, names[j]) == 0)
                break;
        if (j == n_names) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument %R",
                         fname, key);
            return -1;
        }
        if (out[j] != NULL) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'",
                         fname, names[j]);
            return -1;
        }
        out[j] = args[nargs + i];
    }
    return 0;
}

/* ========================================================== find_candidate */

/* _find_candidate(input_ids, max_ngram_size, num_pred_tokens, min_ngram_size,
 *                 semantics, max_length, eos_token_id) -> (start, count)
 * The draft is row[start:start+count] of the input's only row. */
static PyObject *py_find_candidate(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    token_input ti;
    opts_holder oh;
    size_t max_n, k, min_n, start = 0, count = 0;
    pld_status st;
    (void)self;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "_find_candidate() takes 7 arguments");
        return NULL;
    }
    if (parse_size(args[1], "max_ngram_size", 1, PLD_MAX_NGRAM, &max_n) < 0 ||
        parse_size(args[2], "num_pred_tokens", 1, PLD_MAX_DRAFT, &k) < 0 ||
        parse_size(args[3], "min_ngram_size", 1, PLD_MAX_NGRAM, &min_n) < 0)
        return NULL;
    if (min_n > max_n) {
        PyErr_Format(PyExc_ValueError,
                     "min_ngram_size (%zu) must not exceed max_ngram_size (%zu)", min_n, max_n);
        return NULL;
    }
    if (parse_opts(args[4], args[5], args[6], &oh) < 0)
        return NULL;
    if (token_input_get(args[0], "input_ids", 0, &ti) < 0) {
        opts_release(&oh);
        return NULL;
    }
    if (ti.len >= PLD_NOGIL_MIN_ELEMENTS) {
        Py_BEGIN_ALLOW_THREADS
        st = ti.is32 ? pld_find_candidate_i32(ti.data, ti.len, min_n, max_n, k, &oh.opts, &start, &count)
                     : pld_find_candidate_i64(ti.data, ti.len, min_n, max_n, k, &oh.opts, &start, &count);
        Py_END_ALLOW_THREADS
    } else {
        st = ti.is32 ? pld_find_candidate_i32(ti.data, ti.len, min_n, max_n, k, &oh.opts, &start, &count)
                     : pld_find_candidate_i64(ti.data, ti.len, min_n, max_n, k, &oh.opts, &start, &count);
    }
    token_input_release(&ti);
    opts_release(&oh);
    if (st != PLD_OK)
        return raise_status(st, "find_candidate_pred_tokens");
    return Py_BuildValue("(nn)", (Py_ssize_t)start, (Py_ssize_t)count);
}

/* ============================================================== NgramIndex */

/* Drafts repeat the ids of frequent tokens: a process-wide table keeps one
 * int object per id in [0, PLD_INT_CACHE_IDS) once a draft has carried it,
 * so propose() reuses it instead of allocating one per draft token (other
 * ids are allocated as usual). The table is zero pages until ids land in
 * it; it holds at most one object per id of the vocabulary in use (32 bytes
 * each: 1.6 MB for every id of a 50k vocabulary). The GIL guards it. */
#define PLD_INT_CACHE_IDS ((int64_t)1 << 17)

#if defined(__GNUC__) || defined(__clang__)
#define PLD_PREFETCH_READ(p) __builtin_prefetch(p)
#define PLD_PREFETCH_WRITE(p) __builtin_prefetch(p, 1)
#else
#define PLD_PREFETCH_READ(p) ((void)(p))
#define PLD_PREFETCH_WRITE(p) ((void)(p))
#endif

static PyObject **int_cache; /* PLD_INT_CACHE_IDS entries; NULL if the import could not allocate it */

/* The cache's entry for id v; NULL if v is not cached by id. */
static inline PyObject **int_cache_entry(int64_t v)
{
    return int_cache != NULL && v >= 0 && v < PLD_INT_CACHE_IDS ? &int_cache[v] : NULL;
}

static PyObject *cached_int(int64_t v)
{
    PyObject **entry = int_cache_entry(v), *obj;
    if (entry == NULL)
        return PyLong_FromLongLong(v);
    obj = *entry;
    if (obj == NULL) {
        obj = PyLong_FromLongLong(v);
        if (obj == NULL)
            return NULL;
        *entry = obj;
    }
    Py_INCREF(obj);
    return obj;
}

static void int_cache_clear(void)
{
    int64_t i;
    if (int_cache == NULL)
        return;
    for (i = 0; i < PLD_INT_CACHE_IDS; i++)
        Py_CLEAR(int_cache[i]);
    free(int_cache);
    int_cache = NULL;
}

typedef struct {
    PyObject_HEAD
    pld_index *index;
    int64_t *draft;     /* scratch for propose */
    size_t draft_cap;
    int busy;           /* set while the GIL is released over this index */
    size_t last_ngram;  /* match size behind the last proposal (0: none) */
} NgramIndexObject;

static const char *const policy_names[] = {"first", "recent", "frequent"};

static int index_check(NgramIndexObject *self)
{
    if (self->index == NULL) {
        PyErr_SetString(PyExc_ValueError, "NgramIndex is not initialised");
        return -1;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "NgramIndex is in use by another thread");
        return -1;
    }
    return 0;
}

static int NgramIndex_init(NgramIndexObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"max_ngram_size", "min_ngram_size", "policy", NULL};
    PyObject *max_obj = NULL, *min_obj = NULL, *policy_obj = NULL;
    size_t max_n = 3, min_n = 1;
    int policy = PLD_POLICY_FIRST, p;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|OOO:NgramIndex", kwlist, &max_obj,
                                     &min_obj, &policy_obj))
        return -1;
    if (max_obj && parse_size(max_obj, "max_ngram_size", 1, PLD_MAX_NGRAM, &max_n) < 0)
        return -1;
    if (min_obj && parse_size(min_obj, "min_ngram_size", 1, PLD_MAX_NGRAM, &min_n) < 0)
        return -1;
    if (min_n > max_n) {
        PyErr_Format(PyExc_ValueError,
                     "min_ngram_size (%zu) must not exceed max_ngram_size (%zu)", min_n, max_n);
        return -1;
    }
    if (policy_obj) {
        policy = -1;
        if (PyUnicode_Check(policy_obj))
            for (p = 0; p < 3; p++)
                if (PyUnicode_CompareWithASCIIString(policy_obj, policy_names[p]) == 0)
                    policy = p;
        if (policy < 0) {
            PyErr_Format(PyExc_ValueError,
                         "policy must be 'first', 'recent' or 'frequent', got %R", policy_obj);
            return -1;
        }
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "NgramIndex is in use by another thread");
        return -1;
    }
    pld_index_free(self->index);
    self->last_ngram = 0;
    self->index = pld_index_new(min_n, max_n, (pld_policy)policy);
    if (self->index == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void NgramIndex_dealloc(NgramIndexObject *self)
{
    pld_index_free(self->index);
    PyMem_Free(self->draft);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *NgramIndex_extend(NgramIndexObject *self, PyObject *tokens)
{
    token_input ti;
    pld_status st;
    if (index_check(self) < 0)
        return NULL;
    if (PyLong_CheckExact(tokens)) { /* the per-step fast path: one token */
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(tokens, &overflow);
        int64_t t = (int64_t)v;
        if (overflow) {
            PyErr_SetString(PyExc_ValueError, "tokens: token id does not fit in int64");
            return NULL;
        }
        st = pld_index_extend(self->index, &t, 1);
        if (st != PLD_OK)
            return raise_status(st, "tokens");
        Py_RETURN_NONE;
    }
    if (token_input_get(tokens, "tokens", 1, &ti) < 0)
        return NULL;
    if (ti.len >= PLD_NOGIL_MIN_ELEMENTS) {
        self->busy = 1;
        Py_BEGIN_ALLOW_THREADS
        st = ti.is32 ? pld_index_extend_i32(self->index, ti.data, ti.len)
                     : pld_index_extend(self->index, ti.data, ti.len);
        Py_END_ALLOW_THREADS
        self->busy = 0;
    } else {
        st = ti.is32 ? pld_index_extend_i32(self->index, ti.data, ti.len)
                     : pld_index_extend(self->index, ti.data, ti.len);
    }
    token_input_release(&ti);
    if (st != PLD_OK)
        return raise_status(st, "tokens");
    Py_RETURN_NONE;
}

/* The out= of propose: a writable, contiguous 1-D int64 or int32 array in
 * CPU memory (a NumPy array, a torch tensor, array.array, any writable
 * buffer) with room for k ids. Fills av (release it) or raises. */
static int draft_out_get(PyObject *obj, size_t k, array_view *av)
{
    static const char arg[] = "out";
    int got = array_view_get(obj, arg, av, 1);
    if (got < 0)
        goto error;
    if (got == 0) {
        PyErr_Format(PyExc_TypeError,
                     "%s: expected a writable int64 or int32 array, got %.100s", arg,
                     Py_TYPE(obj)->tp_name);
        goto error;
    }
    if (av->kind != 'i' || (av->itemsize != 8 && av->itemsize != 4)) {
        PyErr_Format(PyExc_TypeError, "%s: expected an int64 or int32 array, got %s elements",
                     arg, av->type_name);
        goto error;
    }
    if (av->ndim != 1) {
        PyErr_Format(PyExc_ValueError, "%s: expected a 1-D array, got %d dimensions", arg,
                     av->ndim);
        goto error;
    }
    if ((size_t)av->shape[0] < k) {
        PyErr_Format(PyExc_ValueError,
                     "%s: room for %zd ids, but num_pred_tokens is %zu", arg, av->shape[0], k);
        goto error;
    }
    if (av->strides[0] != av->itemsize && av->shape[0] > 1) {
        PyErr_Format(PyExc_ValueError, "%s: expected a contiguous array, got a strided view",
                     arg);
        goto error;
    }
    return 0;
error:
    array_view_release(av);
    return -1;
}

/* The n ids of draft into out's memory (checked by draft_out_get): all or,
 * if one does not fit an int32 out, none. */
static int draft_out_write(const array_view *av, const int64_t *draft, size_t n)
{
    size_t i;
    if (av->itemsize == 8) {
        memcpy(av->data, draft, n * sizeof(int64_t));
        return 0;
    }
    for (i = 0; i < n; i++)
        if (draft[i] < INT32_MIN || draft[i] > INT32_MAX) {
            PyErr_Format(PyExc_ValueError, "out: draft id %lld does not fit in int32",
                         (long long)draft[i]);
            return -1;
        }
    for (i = 0; i < n; i++)
        ((int32_t *)av->data)[i] = (int32_t)draft[i];
    return 0;
}

/* The draft as a list of ints, the ids' int objects fetched first. */
static PyObject *draft_list(const int64_t *draft, size_t n)
{
    PyObject *list;
    size_t i;
    for (i = 0; i < n; i++) { /* the cache lines of the ids' entries, all at once */
        PyObject **entry = int_cache_entry(draft[i]);
        if (entry != NULL)
            PLD_PREFETCH_READ(entry);
    }
    list = PyList_New((Py_ssize_t)n);
    if (list == NULL)
        return NULL;
    for (i = 0; i < n; i++) { /* then the objects, to be written (their refcounts) */
        PyObject **entry = int_cache_entry(draft[i]);
        if (entry != NULL && *entry != NULL)
            PLD_PREFETCH_WRITE(*entry);
    }
    for (i = 0; i < n; i++) {
        PyObject *item = cached_int(draft[i]);
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    return list;
}

static PyObject *NgramIndex_propose(NgramIndexObject *self, PyObject *const *args,
                                    Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"num_pred_tokens", "semantics", "max_length",
                                        "eos_token_id", "out"};
    PyObject *a[5], *result = NULL;
    size_t k = 10, n;
    opts_holder oh;
    array_view out;
    int has_out = 0;
    if (index_check(self) < 0)
        return NULL;
    if (nargs <= 1 && (kwnames == NULL ||
                       (PyTuple_GET_SIZE(kwnames) == 1 &&
                        PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "out") == 0))) {
        /* the per-step calls: propose(k) and propose(k, out=buffer) */
        a[0] = nargs ? args[0] : NULL;
        a[1] = a[2] = a[3] = NULL;
        a[4] = kwnames ? args[nargs] : NULL;
    } else if (parse_fast_args("propose", args, nargs, kwnames, names, 5, 4, a) < 0) {
        return NULL;
    }
    if (a[0] && parse_size(a[0], "num_pred_tokens", 1, PLD_MAX_DRAFT, &k) < 0)
        return NULL;
    if (a[1] == NULL && a[2] == NULL && a[3] == NULL) {
        oh.opts.semantics = PLD_SEED; /* the defaults; eos_small stays unused */
        oh.opts.max_length = -1;
        oh.opts.eos = NULL;
        oh.opts.n_eos = 0;
        oh.eos_heap = NULL;
    } else if (parse_opts(a[1], a[2], a[3], &oh) < 0) {
        return NULL;
    }
    /* out's view first: a producer's __dlpack__ runs Python code, which must
     * not see the index between propose and the write */
    if (a[4] != NULL && a[4] != Py_None) {
        if (draft_out_get(a[4], k, &out) < 0)
            goto done;
        has_out = 1;
    }
    if (k > self->draft_cap) {
        int64_t *d = PyMem_Realloc(self->draft, k * sizeof(int64_t));
        if (d == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        self->draft = d;
        self->draft_cap = k;
    }
    n = pld_index_propose_n(self->index, k, &oh.opts, self->draft, &self->last_ngram);
    if (has_out)
        result = draft_out_write(&out, self->draft, n) < 0 ? NULL : PyLong_FromSize_t(n);
    else
        result = draft_list(self->draft, n);
done:
    if (has_out)
        array_view_release(&out);
    opts_release(&oh);
    return result;
}

/* reserve(n) and truncate(n): parse n and run op on the index; the GIL is
 * released when n is large and the op may have that much work to do. */
static PyObject *index_sized_op(NgramIndexObject *self, PyObject *arg,
                                pld_status (*op)(pld_index *, size_t), const char *what,
                                int may_release_gil)
{
    size_t n;
    pld_status st;
    if (index_check(self) < 0)
        return NULL;
    if (parse_size(arg, "n", 0, PY_SSIZE_T_MAX, &n) < 0)
        return NULL;
    if (may_release_gil && n >= PLD_NOGIL_MIN_ELEMENTS) {
        self->busy = 1;
        Py_BEGIN_ALLOW_THREADS
        st = op(self->index, n);
        Py_END_ALLOW_THREADS
        self->busy = 0;
    } else {
        st = op(self->index, n);
    }
    if (st != PLD_OK)
        return raise_status(st, what);
    Py_RETURN_NONE;
}

static PyObject *NgramIndex_reserve(NgramIndexObject *self, PyObject *arg)
{
    return index_sized_op(self, arg, pld_index_reserve, "reserve", 1);
}

static PyObject *NgramIndex_truncate(NgramIndexObject *self, PyObject *arg)
{
    return index_sized_op(self, arg, pld_index_truncate, "truncate", 0);
}

static PyObject *NgramIndex_tokens(NgramIndexObject *self, PyObject *unused)
{
    (void)unused;
    if (index_check(self) < 0)
        return NULL;
    return list_from_i64(pld_index_tokens(self->index), pld_index_len(self->index));
}

static Py_ssize_t NgramIndex_len(NgramIndexObject *self)
{
    if (index_check(self) < 0)
        return -1;
    return (Py_ssize_t)pld_index_len(self->index);
}

static PyObject *NgramIndex_get_nbytes(NgramIndexObject *self, void *c)
{
    (void)c;
    if (index_check(self) < 0)
        return NULL;
    return PyLong_FromSize_t(pld_index_nbytes(self->index) + self->draft_cap * sizeof(int64_t));
}

static PyObject *NgramIndex_get_last_ngram(NgramIndexObject *self, void *c)
{
    (void)c;
    return PyLong_FromSize_t(self->last_ngram);
}

static PyObject *NgramIndex_get_policy(NgramIndexObject *self, void *c)
{
    (void)c;
    if (index_check(self) < 0)
        return NULL;
    return PyUnicode_FromString(policy_names[pld_index_policy(self->index)]);
}

static PyObject *NgramIndex_get_min(NgramIndexObject *self, void *c)
{
    (void)c;
    if (index_check(self) < 0)
        return NULL;
    return PyLong_FromSize_t(pld_index_min_n(self->index));
}

static PyObject *NgramIndex_get_max(NgramIndexObject *self, void *c)
{
    (void)c;
    if (index_check(self) < 0)
        return NULL;
    return PyLong_FromSize_t(pld_index_max_n(self->index));
}

static PyObject *NgramIndex_repr(NgramIndexObject *self)
{
    if (self->index == NULL)
        return PyUnicode_FromString("<NgramIndex (uninitialised)>");
    return PyUnicode_FromFormat("NgramIndex(max_ngram_size=%zu, min_ngram_size=%zu, "
                                "policy='%s') with %zu tokens",
                                pld_index_max_n(self->index), pld_index_min_n(self->index),
                                policy_names[pld_index_policy(self->index)],
                                pld_index_len(self->index));
}

static PyMethodDef NgramIndex_methods[] = {
    {"extend", (PyCFunction)NgramIndex_extend, METH_O,
     "extend(tokens)\n--\n\nAppend one token id or a sequence/array/tensor of ids."},
    {"propose", (PyCFunction)(void (*)(void))NgramIndex_propose, METH_FASTCALL | METH_KEYWORDS,
     "propose(num_pred_tokens=10, semantics='seed', max_length=None, eos_token_id=None, out=None)\n--\n\n"
     "The draft for the current sequence, as a list of ints (possibly empty).\n\n"
     "With out (a writable, contiguous 1-D int64 or int32 array in CPU memory -- a NumPy\n"
     "array, a torch tensor, array.array -- with room for num_pred_tokens ids): write\n"
     "the draft to out[:n] and return n; out[n:] is left as it was. No list and no int\n"
     "objects are made: a loop writes the draft straight into its sequence buffer."},
    {"reserve", (PyCFunction)NgramIndex_reserve, METH_O,
     "reserve(n)\n--\n\nMake room for n more tokens, so that the next extends (n tokens in\n"
     "all) never grow a table: each then costs O(max_ngram_size) at worst, not only on\n"
     "average. A generation loop reserves the number of new tokens it may add."},
    {"truncate", (PyCFunction)NgramIndex_truncate, METH_O,
     "truncate(n)\n--\n\nKeep the first n tokens."},
    {"tokens", (PyCFunction)NgramIndex_tokens, METH_NOARGS,
     "tokens()\n--\n\nThe indexed sequence as a list of ints."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef NgramIndex_getset[] = {
    {"nbytes", (getter)NgramIndex_get_nbytes, NULL, "Heap bytes owned by the index.", NULL},
    {"policy", (getter)NgramIndex_get_policy, NULL, "The match policy.", NULL},
    {"min_ngram_size", (getter)NgramIndex_get_min, NULL, "Smallest n-gram size.", NULL},
    {"max_ngram_size", (getter)NgramIndex_get_max, NULL, "Largest n-gram size.", NULL},
    {"last_ngram", (getter)NgramIndex_get_last_ngram, NULL,
     "Size of the n-gram match behind the last proposal (0: it proposed nothing).", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PySequenceMethods NgramIndex_as_sequence = {
    .sq_length = (lenfunc)NgramIndex_len,
};

static PyTypeObject NgramIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pld.NgramIndex",
    .tp_basicsize = sizeof(NgramIndexObject),
    .tp_dealloc = (destructor)NgramIndex_dealloc,
    .tp_repr = (reprfunc)NgramIndex_repr,
    .tp_as_sequence = &NgramIndex_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "NgramIndex(max_ngram_size=3, min_ngram_size=1, policy='first')\n--\n\n"
              "An incremental n-gram index over one growing token sequence.",
    .tp_methods = NgramIndex_methods,
    .tp_getset = NgramIndex_getset,
    .tp_init = (initproc)NgramIndex_init,
    .tp_new = PyType_GenericNew,
};

/* ============================================================== Generator */

typedef struct {
    PyObject_HEAD
    pld_rng rng;
} GeneratorObject;

static int Generator_init(GeneratorObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"seed", NULL};
    PyObject *seed = Py_None;
    uint64_t s;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:Generator", kwlist, &seed))
        return -1;
    if (seed == Py_None) {
        s = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)self ^ ((uint64_t)clock() << 32);
    } else if (PyLong_Check(seed)) {
        s = (uint64_t)PyLong_AsUnsignedLongLongMask(seed);
        if (PyErr_Occurred())
            return -1;
    } else {
        PyErr_Format(PyExc_TypeError, "seed must be an int or None, got %.100s",
                     Py_TYPE(seed)->tp_name);
        return -1;
    }
    pld_rng_seed(&self->rng, s);
    return 0;
}

static PyObject *Generator_random(GeneratorObject *self, PyObject *unused)
{
    (void)unused;
    return PyFloat_FromDouble(pld_rng_uniform(&self->rng));
}

static PyMethodDef Generator_methods[] = {
    {"random", (PyCFunction)Generator_random, METH_NOARGS,
     "random()\n--\n\nA float in [0, 1)."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject GeneratorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pld.Generator",
    .tp_basicsize = sizeof(GeneratorObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Generator(seed=None)\n--\n\nA seedable uniform generator (xoshiro256**).",
    .tp_methods = Generator_methods,
    .tp_init = (initproc)Generator_init,
    .tp_new = PyType_GenericNew,
};

static pld_rng default_rng;

/* ============================================================== acceptance */

static PyObject *result_tuple(size_t n, const int64_t *tokens)
{
    PyObject *list = list_from_i64(tokens, n + 1), *out;
    if (list == NULL)
        return NULL;
    out = Py_BuildValue("(nN)", (Py_ssize_t)n, list);
    return out;
}

static PyObject *py_accept_greedy(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    token_input draft, chosen;
    PyObject *out = NULL;
    int64_t *d = NULL, *c = NULL;
    size_t i, n;
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "accept_greedy(draft, chosen) takes 2 arguments");
        return NULL;
    }
    if (token_input_get(args[0], "draft", 0, &draft) < 0)
        return NULL;
    if (token_input_get(args[1], "chosen", 0, &chosen) < 0) {
        token_input_release(&draft);
        return NULL;
    }
    if (chosen.len < draft.len + 1) {
        PyErr_Format(PyExc_ValueError,
                     "chosen: expected at least len(draft) + 1 = %zu ids, got %zu",
                     draft.len + 1, chosen.len);
        goto error;
    }
    d = PyMem_Malloc((draft.len + 1) * sizeof(int64_t));
    c = PyMem_Malloc((draft.len + 1) * sizeof(int64_t));
    if (d == NULL || c == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    for (i = 0; i < draft.len; i++)
        d[i] = draft.is32 ? ((const int32_t *)draft.data)[i] : ((const int64_t *)draft.data)[i];
    for (i = 0; i <= draft.len; i++)
        c[i] = chosen.is32 ? ((const int32_t *)chosen.data)[i] : ((const int64_t *)chosen.data)[i];
    n = pld_accept_greedy_ids(d, draft.len, c);
    out = result_tuple(n, c);
error:
    PyMem_Free(d);
    PyMem_Free(c);
    token_input_release(&draft);
    token_input_release(&chosen);
    return out;
}

/* The draft as int64, owned by the caller (PyMem_Free). */
static int64_t *draft_i64(PyObject *obj, size_t *k)
{
    token_input ti;
    int64_t *d;
    size_t i;
    if (token_input_get(obj, "draft", 0, &ti) < 0)
        return NULL;
    d = PyMem_Malloc((ti.len + 1) * sizeof(int64_t));
    if (d == NULL) {
        token_input_release(&ti);
        PyErr_NoMemory();
        return NULL;
    }
    for (i = 0; i < ti.len; i++)
        d[i] = ti.is32 ? ((const int32_t *)ti.data)[i] : ((const int64_t *)ti.data)[i];
    *k = ti.len;
    token_input_release(&ti);
    return d;
}

static int check_rows(const float_input *fi, const char *arg, size_t k)
{
    if (fi->rows < k + 1) {
        PyErr_Format(PyExc_ValueError, "%s: expected at least len(draft) + 1 = %zu rows, got %zu",
                     arg, k + 1, fi->rows);
        return -1;
    }
    return 0;
}

static PyObject *py_accept_greedy_logits(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    float_input fi;
    int64_t *d = NULL, *out_tokens = NULL;
    size_t k = 0, n = 0;
    pld_status st;
    PyObject *out = NULL;
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError,
                        "accept_greedy_logits(draft, logits) takes 2 arguments");
        return NULL;
    }
    d = draft_i64(args[0], &k);
    if (d == NULL)
        return NULL;
    if (float_input_get(args[1], "logits", &fi) < 0)
        goto error;
    if (check_rows(&fi, "logits", k) < 0)
        goto error;
    out_tokens = PyMem_Malloc((k + 1) * sizeof(int64_t));
    if (out_tokens == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    if ((k + 1) * fi.vocab >= PLD_NOGIL_MIN_ELEMENTS) {
        Py_BEGIN_ALLOW_THREADS
        st = pld_accept_greedy_logits(fi.data, fi.ftype, fi.rows, fi.vocab, d, k, out_tokens, &n);
        Py_END_ALLOW_THREADS
    } else {
        st = pld_accept_greedy_logits(fi.data, fi.ftype, fi.rows, fi.vocab, d, k, out_tokens, &n);
    }
    if (st != PLD_OK) {
        raise_status(st, "logits");
        goto error;
    }
    out = result_tuple(n, out_tokens);
error:
    float_input_release(&fi);
    PyMem_Free(d);
    PyMem_Free(out_tokens);
    return out;
}

static int parse_uniforms(PyObject *obj, size_t need, double *out)
{
    PyObject *fast = PySequence_Fast(obj, "");
    Py_ssize_t i, n;
    if (fast == NULL || PyUnicode_Check(obj) || PyBytes_Check(obj)) {
        Py_XDECREF(fast);
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "uniforms: expected a sequence of floats, got %.100s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    n = PySequence_Fast_GET_SIZE(fast);
    if ((size_t)n != need) {
        PyErr_Format(PyExc_ValueError, "uniforms: expected len(draft) + 1 = %zu values, got %zd",
                     need, n);
        Py_DECREF(fast);
        return -1;
    }
    for (i = 0; i < n; i++) {
        double u = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(fast, i));
        if (u == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "uniforms: expected floats");
            Py_DECREF(fast);
            return -1;
        }
        if (!(u >= 0.0 && u < 1.0)) {
            PyErr_Format(PyExc_ValueError, "uniforms: values must lie in [0, 1), got %R",
                         PySequence_Fast_GET_ITEM(fast, i));
            Py_DECREF(fast);
            return -1;
        }
        out[i] = u;
    }
    Py_DECREF(fast);
    return 0;
}

static PyObject *py_accept_sample(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames)
{
    static const char *const names[] = {"draft", "probs", "generator", "uniforms"};
    PyObject *a[4], *out = NULL;
    float_input fi;
    int64_t *d = NULL, *out_tokens = NULL;
    double *u = NULL;
    size_t k = 0, n = 0, i;
    pld_status st;
    (void)self;
    memset(&fi, 0, sizeof(fi));
    if (parse_fast_args("accept_sample", args, nargs, kwnames, names, 4, 2, a) < 0)
        return NULL;
    if (a[0] == NULL || a[1] == NULL) {
        PyErr_SetString(PyExc_TypeError, "accept_sample() needs draft and probs");
        return NULL;
    }
    if (a[2] != NULL && a[2] != Py_None && !PyObject_TypeCheck(a[2], &GeneratorType)) {
        PyErr_Format(PyExc_TypeError, "generator: expected a pld.Generator, got %.100s",
                     Py_TYPE(a[2])->tp_name);
        return NULL;
    }
    d = draft_i64(a[0], &k);
    if (d == NULL)
        return NULL;
    if (float_input_get(a[1], "probs", &fi) < 0 || check_rows(&fi, "probs", k) < 0)
        goto error;
    u = PyMem_Malloc((k + 1) * sizeof(double));
    out_tokens = PyMem_Malloc((k + 1) * sizeof(int64_t));
    if (u == NULL || out_tokens == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    if (a[3] != NULL && a[3] != Py_None) {
        if (parse_uniforms(a[3], k + 1, u) < 0)
            goto error;
    } else {
        pld_rng *rng = (a[2] != NULL && a[2] != Py_None) ? &((GeneratorObject *)a[2])->rng
                                                          : &default_rng;
        for (i = 0; i <= k; i++)
            u[i] = pld_rng_uniform(rng);
    }
    if ((k + 1) * fi.vocab >= PLD_NOGIL_MIN_ELEMENTS) {
        Py_BEGIN_ALLOW_THREADS
        st = pld_accept_sample(fi.data, fi.ftype, fi.rows, fi.vocab, d, k, u, out_tokens, &n);
        Py_END_ALLOW_THREADS
    } else {
        st = pld_accept_sample(fi.data, fi.ftype, fi.rows, fi.vocab, d, k, u, out_tokens, &n);
    }
    if (st != PLD_OK) {
        raise_status(st, "probs");
        goto error;
    }
    out = result_tuple(n, out_tokens);
error:
    float_input_release(&fi);
    PyMem_Free(d);
    PyMem_Free(u);
    PyMem_Free(out_tokens);
    return out;
}

/* ================================================================== module */

/* _ngram_tag(tokens) -> int: the index's tag of the n-gram `tokens`. */
static PyObject *py_ngram_tag(PyObject *self, PyObject *tokens)
{
    token_input ti;
    int64_t key[PLD_MAX_NGRAM + 1];
    size_t i;
    (void)self;
    if (token_input_get(tokens, "tokens", 0, &ti) < 0)
        return NULL;
    if (ti.len < 1 || ti.len > PLD_MAX_NGRAM + 1) {
        token_input_release(&ti);
        PyErr_Format(PyExc_ValueError, "tokens must hold 1 to %d ids, got %zu",
                     PLD_MAX_NGRAM + 1, ti.len);
        return NULL;
    }
    for (i = 0; i < ti.len; i++)
        key[i] = ti.is32 ? ((const int32_t *)ti.data)[i] : ((const int64_t *)ti.data)[i];
    i = ti.len;
    token_input_release(&ti);
    return PyLong_FromUnsignedLong(pld_index_ngram_tag(key, i, 0));
}

static PyMethodDef module_methods[] = {
    {"_ngram_tag", (PyCFunction)py_ngram_tag, METH_O,
     "_ngram_tag(tokens) -> int: the index's hash tag of an n-gram (for tests)"},
    {"_find_candidate", (PyCFunction)(void (*)(void))py_find_candidate, METH_FASTCALL,
     "_find_candidate(input_ids, max_ngram_size, num_pred_tokens, min_ngram_size, semantics, "
     "max_length, eos_token_id) -> (start, count)"},
    {"accept_greedy", (PyCFunction)(void (*)(void))py_accept_greedy, METH_FASTCALL,
     "accept_greedy(draft, chosen)\n--\n\n"
     "Greedy acceptance from the model's chosen ids at the k+1 verified positions.\n"
     "Returns (n, tokens): n accepted draft tokens and the n+1 tokens to append."},
    {"accept_greedy_logits", (PyCFunction)(void (*)(void))py_accept_greedy_logits, METH_FASTCALL,
     "accept_greedy_logits(draft, logits)\n--\n\n"
     "Greedy acceptance fused with the argmax over [k+1, V] float32/float16/bfloat16 logits.\n"
     "Returns (n, tokens)."},
    {"accept_sample", (PyCFunction)(void (*)(void))py_accept_sample, METH_FASTCALL | METH_KEYWORDS,
     "accept_sample(draft, probs, *, generator=None, uniforms=None)\n--\n\n"
     "Exact speculative sampling of a deterministic draft against [k+1, V] probabilities.\n"
     "Returns (n, tokens)."},
    {NULL, NULL, 0, NULL}};

static void module_free(void *module)
{
    (void)module;
    int_cache_clear();
}

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "pld._core", "The C core of pld.", -1, module_methods,
    NULL, NULL, NULL, module_free};

PyMODINIT_FUNC PyInit__core(void)
{
    PyObject *m;
    if (PyType_Ready(&NgramIndexType) < 0 || PyType_Ready(&GeneratorType) < 0)
        return NULL;
    m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    int_cache = calloc((size_t)PLD_INT_CACHE_IDS, sizeof(PyObject *)); /* NULL: no cache */
    pld_rng_seed(&default_rng, (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32));
    Py_INCREF(&NgramIndexType);
    if (PyModule_AddObject(m, "NgramIndex", (PyObject *)&NgramIndexType) < 0)
        goto error;
    Py_INCREF(&GeneratorType);
    if (PyModule_AddObject(m, "Generator", (PyObject *)&GeneratorType) < 0)
        goto error;
    if (PyModule_AddIntConstant(m, "MAX_NGRAM", PLD_MAX_NGRAM) < 0)
        goto error;
    return m;
error:
    Py_DECREF(m);
    return NULL;
}
