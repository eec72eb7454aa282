/*
 * pld_module.c -- the CPython binding of the pld core (module pld._core).
 *
 * The only file that talks to Python. It turns Python objects into
 * (pointer, length) views without copying where it can, calls the core, and
 * turns the answer back into Python objects. Token ids come in three kinds:
 * a sequence of ints (copied), a 1-D C-contiguous integer buffer in native
 * byte order (NumPy, array.array, memoryview: read in place, or copied when
 * misaligned or narrower than int32), and a DLPack tensor (torch and
 * friends, without linking them; [L] or [1, L], any strides). Any other
 * buffer -- byte-swapped, strided, multi-dimensional (np.matrix) -- is
 * refused with an error naming the argument.
 *
 * Rules every entry point keeps (caller memory is never read while Python
 * code can run, and no error is swallowed):
 *   - Arguments whose conversion can run Python code (__index__, __float__,
 *     iteration, __getattr__, __dlpack__) are converted first, into values
 *     or memory the binding owns. At most one argument is then read in
 *     place, as the last step, and nothing calls back into Python until the
 *     core is done with it.
 *   - Sequences are read from a snapshot (a tuple holding references to the
 *     items), so an item's __index__ that shrinks the list frees nothing the
 *     conversion still reads.
 *   - Every field of a DLPack tensor is checked before it is used (ndim,
 *     shape, strides, dtype, data, byte offset, device, version).
 *   - Memory is read in place only when it is aligned for its element type;
 *     otherwise it is copied with memcpy-based loads.
 *   - A failed conversion replaces only TypeError, ValueError, OverflowError
 *     and BufferError (with the original as __cause__); KeyboardInterrupt,
 *     MemoryError and the rest pass through unchanged.
 *   - The GIL is released over long loops only on memory nobody else can
 *     free meanwhile: the binding's own copies and buffer exports (an
 *     exporter keeps the memory until the view is released; NumPy's unsafe
 *     resize(refcheck=False) does not, and is the caller's, as with any
 *     reader of the buffer). A DLPack view
 *     is read with the GIL held, which is all the binding can do: torch's
 *     resize_() and set_() run without the GIL, so a caller's thread that
 *     resizes a tensor while pld reads it frees memory under the read, as
 *     it would under torch's own kernels. The contract:
 *     a tensor passed to pld is not resized or re-pointed meanwhile (README,
 *     "The C core from Python").
 *
 * Sections: errors | views of arrays | token inputs | float inputs | small
 * parsers | find_candidate | NgramIndex | DraftState | Corpus | acceptance |
 * module.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __linux__
#include <sys/random.h>
#include <unistd.h>
#endif

#include "dlpack_abi.h"
#include "pld.h"
#include "pld_internal.h"

/* Inputs longer than this are scanned with the GIL released. */
#define PLD_NOGIL_MIN_ELEMENTS ((size_t)1 << 15)
/* num_pred_tokens beyond this is certainly a mistake. */
#define PLD_MAX_DRAFT ((Py_ssize_t)1 << 20)

/* Run `stmt` with the GIL released when `cond` holds. Use it only over
 * memory that no other thread can free meanwhile (see the rules above). */
#define PLD_MAYBE_WITHOUT_GIL(cond, stmt) \
    do {                                  \
        if (cond) {                       \
            Py_BEGIN_ALLOW_THREADS        \
            stmt;                         \
            Py_END_ALLOW_THREADS          \
        } else {                          \
            stmt;                         \
        }                                 \
    } while (0)

/* ================================================================== errors */

/* Is the pending exception one a conversion may replace with its own
 * message (the object was the wrong kind of thing)? */
static int error_is_replaceable(int also_runtime)
{
    return PyErr_ExceptionMatches(PyExc_TypeError) || PyErr_ExceptionMatches(PyExc_ValueError) ||
           PyErr_ExceptionMatches(PyExc_OverflowError) ||
           PyErr_ExceptionMatches(PyExc_BufferError) ||
           (also_runtime && (PyErr_ExceptionMatches(PyExc_RuntimeError) ||
                             PyErr_ExceptionMatches(PyExc_NotImplementedError)));
}

/* Replace the pending exception with `type` (NULL: ValueError for a
 * ValueError or OverflowError, else TypeError) and the message, the original
 * as __cause__. Returns -1. */
static int raise_from_pending(PyObject *type, const char *fmt, ...)
{
    PyObject *et, *ev, *etb, *nt, *nv, *ntb;
    va_list va;
    if (type == NULL)
        type = PyErr_ExceptionMatches(PyExc_ValueError) || PyErr_ExceptionMatches(PyExc_OverflowError)
                   ? PyExc_ValueError
                   : PyExc_TypeError;
    PyErr_Fetch(&et, &ev, &etb);
    PyErr_NormalizeException(&et, &ev, &etb);
    if (etb != NULL)
        PyException_SetTraceback(ev, etb);
    va_start(va, fmt);
    PyErr_FormatV(type, fmt, va);
    va_end(va);
    PyErr_Fetch(&nt, &nv, &ntb);
    PyErr_NormalizeException(&nt, &nv, &ntb);
    if (nv != NULL && ev != NULL)
        PyException_SetCause(nv, ev); /* steals ev */
    else
        Py_XDECREF(ev);
    PyErr_Restore(nt, nv, ntb);
    Py_XDECREF(et);
    Py_XDECREF(etb);
    return -1;
}

/* ========================================================= views of arrays */

/* The one table of element type names: (kind, itemsize) -> name, NULL if
 * none. kind: 'i' signed, 'u' unsigned, 'f' float, 'b' bfloat16, '?' bool. */
static const char *dtype_name(char kind, int itemsize)
{
    static const char *const ints[] = {"int8", "int16", 0, "int32", 0, 0, 0, "int64"};
    static const char *const uints[] = {"uint8", "uint16", 0, "uint32", 0, 0, 0, "uint64"};
    static const char *const floats[] = {0, "float16", 0, "float32", 0, 0, 0, "float64"};
    if (itemsize < 1 || itemsize > 8)
        return NULL;
    switch (kind) {
    case 'i': return ints[itemsize - 1];
    case 'u': return uints[itemsize - 1];
    case 'f': return floats[itemsize - 1];
    case 'b': return itemsize == 2 ? "bfloat16" : NULL;
    case '?': return itemsize == 1 ? "bool" : NULL;
    default: return NULL;
    }
}

#define PLD_MAX_DIMS 3

typedef struct {
    char *data;
    int ndim;
    Py_ssize_t shape[PLD_MAX_DIMS];
    Py_ssize_t strides[PLD_MAX_DIMS]; /* bytes */
    char kind;             /* as in dtype_names; 'x': a type nothing here reads */
    int itemsize;
    const char *type_name; /* for messages */
    int gil_free_ok;       /* a buffer export: may be read without the GIL */
    int has_view;
    PyObject *capsule;
    /* set before they are read (not cleared by array_view_get): */
    char type_buf[48];     /* type_name of an unusual DLPack type or buffer format */
    Py_buffer view;
} array_view;

static void array_view_release(array_view *av)
{
    if (av->has_view) {
        PyBuffer_Release(&av->view);
        av->has_view = 0;
    }
    Py_CLEAR(av->capsule);
}

/* Is p aligned for elements of `size` bytes (a power of two up to 8)? */
static inline int is_aligned(const void *p, int size)
{
    return ((uintptr_t)p & (uintptr_t)(size - 1)) == 0;
}

/* The kind of a buffer's struct-module format; 0 if none is supported (a
 * byte order other than the machine's included). */
static char buffer_kind(const char *fmt)
{
    char c;
    if (fmt == NULL)
        fmt = "B";
    if (*fmt == '@' || *fmt == '=' || *fmt == (PY_LITTLE_ENDIAN ? '<' : '>'))
        fmt++;
    if (fmt[0] == '\0' || fmt[1] != '\0')
        return 0;
    c = fmt[0];
    if (strchr("bhilqn", c))
        return 'i';
    if (strchr("BHILQN", c))
        return 'u';
    if (c == 'e' || c == 'f' || c == 'd')
        return 'f';
    if (c == '?')
        return '?';
    return 0;
}

/* av from obj's buffer. A format nothing here reads gets kind 'x' and a
 * type_name that quotes it (and no shape): the caller refuses it. */
static int view_from_buffer(PyObject *obj, const char *arg, array_view *av)
{
    int i;
    if (PyObject_GetBuffer(obj, &av->view, PyBUF_RECORDS_RO) < 0) {
        if (!error_is_replaceable(0))
            return -1;
        return raise_from_pending(PyExc_TypeError,
                                  "%s: the %.100s buffer cannot be read as a typed array", arg,
                                  Py_TYPE(obj)->tp_name);
    }
    av->has_view = 1;
    av->gil_free_ok = 1;
    av->itemsize = av->view.itemsize >= 1 && av->view.itemsize <= 8 ? (int)av->view.itemsize : 0;
    av->kind = buffer_kind(av->view.format);
    av->type_name = av->kind ? dtype_name(av->kind, av->itemsize) : NULL;
    if (av->type_name == NULL) {
        av->kind = 'x';
        PyOS_snprintf(av->type_buf, sizeof(av->type_buf), "buffer format '%.20s'",
                      av->view.format ? av->view.format : "B");
        av->type_name = av->type_buf;
        return 0;
    }
    if (av->view.ndim < 0 || av->view.ndim > PLD_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "%s: expected at most %d dimensions, got %d", arg,
                     PLD_MAX_DIMS, av->view.ndim);
        return -1;
    }
    av->ndim = av->view.ndim;
    av->data = av->view.buf;
    for (i = 0; i < av->ndim; i++) {
        av->shape[i] = av->view.shape ? av->view.shape[i] : av->view.len / av->view.itemsize;
        av->strides[i] = av->view.strides ? av->view.strides[i] : av->itemsize;
        if (av->shape[i] < 0) {
            PyErr_Format(PyExc_ValueError, "%s: negative dimension %zd", arg, av->shape[i]);
            return -1;
        }
    }
    return 0;
}

/* Fill av's dtype from a DLPack dtype; an unusual one gets kind 'x' and a
 * descriptive name (float8 is "float8", never a neighbour's name). */
static void dlpack_dtype(const pld_dl_dtype *dt, array_view *av)
{
    static const char *const codes[] = {"int", "uint", "float", "opaque", "bfloat", "complex",
                                        "bool"};
    static const char kinds[] = {'i', 'u', 'f', 'x', 'b', 'x', '?'};
    const char *base = dt->code < sizeof(kinds) ? codes[dt->code] : NULL;
    av->kind = 'x';
    av->itemsize = dt->bits >= 8 ? dt->bits / 8 : 1; /* for size checks only when 'x' */
    av->type_name = NULL;
    if (base != NULL && dt->lanes == 1 && dt->bits % 8 == 0 && dt->bits > 0) {
        av->type_name = dtype_name(kinds[dt->code], dt->bits / 8);
        if (av->type_name != NULL)
            av->kind = kinds[dt->code];
    }
    if (av->type_name == NULL) {
        if (base != NULL)
            PyOS_snprintf(av->type_buf, sizeof(av->type_buf), "%s%u%s", base,
                          (unsigned)dt->bits, dt->lanes == 1 ? "" : " (vector lanes)");
        else
            PyOS_snprintf(av->type_buf, sizeof(av->type_buf), "DLPack type code %u, %u bits",
                          (unsigned)dt->code, (unsigned)dt->bits);
        av->type_name = av->type_buf;
    }
}

/* Check every field of a DLPack tensor and fill av from it. */
static int dlpack_fill(const pld_dl_tensor *t, const char *arg, array_view *av)
{
    Py_ssize_t count = 1, elem, span_hi = 0, span_lo = 0;
    uintptr_t base;
    int i;
    if (t->device.device_type != PLD_DL_CPU && t->device.device_type != PLD_DL_CUDA_HOST) {
        PyErr_Format(PyExc_ValueError,
                     "%s: expected a tensor in CPU memory, got one on DLPack device type %d "
                     "(copy it to the CPU first)",
                     arg, (int)t->device.device_type);
        return -1;
    }
    if (t->ndim < 0 || t->ndim > PLD_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "%s: expected at most %d dimensions, got %d", arg,
                     PLD_MAX_DIMS, (int)t->ndim);
        return -1;
    }
    if (t->ndim > 0 && t->shape == NULL) {
        PyErr_Format(PyExc_ValueError, "%s: the DLPack tensor has no shape", arg);
        return -1;
    }
    dlpack_dtype(&t->dtype, av);
    elem = av->itemsize;
    av->ndim = t->ndim;
    for (i = 0; i < t->ndim; i++) {
        int64_t n = t->shape[i];
        if (n < 0 || n > PY_SSIZE_T_MAX) {
            PyErr_Format(PyExc_ValueError, "%s: invalid DLPack dimension %lld", arg, (long long)n);
            return -1;
        }
        if (n > 0 && count > PY_SSIZE_T_MAX / elem / (Py_ssize_t)n) {
            PyErr_Format(PyExc_ValueError, "%s: the DLPack tensor is larger than memory", arg);
            return -1;
        }
        count *= (Py_ssize_t)n;
        av->shape[i] = (Py_ssize_t)n;
    }
    /* strides in bytes, and the lowest and highest byte an element may sit at */
    {
        Py_ssize_t step = elem;
        for (i = t->ndim - 1; i >= 0; i--) {
            Py_ssize_t s;
            if (t->strides == NULL) {
                s = step;
                step *= av->shape[i] > 0 ? av->shape[i] : 1;
            } else {
                int64_t e = t->strides[i];
                if (e > PY_SSIZE_T_MAX / elem || e < -(PY_SSIZE_T_MAX / elem)) {
                    PyErr_Format(PyExc_ValueError, "%s: invalid DLPack stride %lld", arg,
                                 (long long)e);
                    return -1;
                }
                s = (Py_ssize_t)e * elem;
            }
            av->strides[i] = s;
            if (av->shape[i] > 1) {
                Py_ssize_t reach = av->shape[i] - 1, mag = s < 0 ? -s : s;
                if (mag != 0 && reach > (PY_SSIZE_T_MAX / 2) / mag) {
                    PyErr_Format(PyExc_ValueError, "%s: the DLPack strides reach past memory", arg);
                    return -1;
                }
                if (s < 0)
                    span_lo += reach * mag;
                else
                    span_hi += reach * mag;
                if (span_lo > PY_SSIZE_T_MAX / 2 || span_hi > PY_SSIZE_T_MAX / 2) {
                    PyErr_Format(PyExc_ValueError, "%s: the DLPack strides reach past memory", arg);
                    return -1;
                }
            }
        }
    }
    if (count == 0) { /* nothing will be read: no pointer to check */
        av->data = NULL;
        return 0;
    }
    if (t->data == NULL) {
        PyErr_Format(PyExc_ValueError, "%s: the DLPack tensor has no data", arg);
        return -1;
    }
    base = (uintptr_t)t->data;
    if (t->byte_offset > (uint64_t)(PY_SSIZE_T_MAX / 2) || base + t->byte_offset < base ||
        base + t->byte_offset < (uintptr_t)span_lo ||
        base + t->byte_offset + (uintptr_t)span_hi + (uintptr_t)elem < base + t->byte_offset) {
        PyErr_Format(PyExc_ValueError, "%s: invalid DLPack byte offset %llu", arg,
                     (unsigned long long)t->byte_offset);
        return -1;
    }
    av->data = (char *)(base + (uintptr_t)t->byte_offset);
    return 0;
}

/* 0 if obj has no torch "lazy" bit set (is_neg(), is_conj(): a tensor
 * whose values are its memory negated or conjugated, which its DLPack
 * export does not say); else -1, a TypeError naming arg (or the check's
 * own error). Runs Python code: call it before any view is taken. */
static int refuse_lazy_bits(PyObject *obj, const char *arg)
{
    static const char *const bits[] = {"is_neg", "is_conj"};
    static const char *const fixes[] = {"resolve_neg", "resolve_conj"};
    size_t b;
    for (b = 0; b < sizeof(bits) / sizeof(bits[0]); b++) {
        PyObject *method = PyObject_GetAttrString(obj, bits[b]), *set;
        int truth = -1;
        if (method == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
            PyErr_Clear();
            continue;
        }
        if (method != NULL) {
            set = PyObject_CallNoArgs(method);
            Py_DECREF(method);
            if (set != NULL) {
                truth = PyObject_IsTrue(set);
                Py_DECREF(set);
            }
        }
        if (truth < 0) /* (the object's own error: replaced naming the argument, kept as the cause) */
            return error_is_replaceable(1)
                       ? raise_from_pending(PyExc_ValueError, "%s: the %.100s's %s() failed", arg,
                                            Py_TYPE(obj)->tp_name, bits[b])
                       : -1;
        if (truth) {
            PyErr_Format(PyExc_TypeError,
                         "%s: the tensor's %s() bit is set (its values are not its memory's): pass "
                         "tensor.%s()", arg, bits[b], fixes[b]);
            return -1;
        }
    }
    return 0;
}

/* av from obj.__dlpack__ (method, already looked up): the producer runs
 * Python code here; nothing else of the caller's is viewed yet. */
static int view_from_dlpack(PyObject *obj, PyObject *method, const char *arg, array_view *av)
{
    const pld_dl_tensor *t;
    if (refuse_lazy_bits(obj, arg) < 0)
        return -1;
    av->capsule = PyObject_CallNoArgs(method);
    if (av->capsule == NULL) {
        /* the producer refused (a meta tensor, one that requires grad...):
         * a ValueError naming the argument, the producer's error as cause */
        if (!error_is_replaceable(1))
            return -1;
        return raise_from_pending(PyExc_ValueError, "%s: the %.100s cannot be read through DLPack",
                                  arg, Py_TYPE(obj)->tp_name);
    }
    if (PyCapsule_IsValid(av->capsule, "dltensor")) {
        pld_dl_managed *m = PyCapsule_GetPointer(av->capsule, "dltensor");
        t = &m->dl_tensor;
    } else if (PyCapsule_IsValid(av->capsule, "dltensor_versioned")) {
        pld_dl_managed_versioned *m = PyCapsule_GetPointer(av->capsule, "dltensor_versioned");
        if (m->version_major != 1) {
            PyErr_Format(PyExc_TypeError, "%s: unsupported DLPack version %u", arg,
                         (unsigned)m->version_major);
            return -1;
        }
        t = &m->dl_tensor;
    } else {
        PyErr_Format(PyExc_TypeError, "%s: __dlpack__ did not return a DLPack capsule", arg);
        return -1;
    }
    return dlpack_fill(t, arg, av);
}

/* 1: obj is an array and av is filled; 0: not an array; -1: error (av may
 * hold a view all the same: release it). Text and bytes are refused here:
 * their bytes would pass for uint8 ids. */
static int array_view_get(PyObject *obj, const char *arg, array_view *av)
{
    PyObject *method;
    int rc;
    memset(av, 0, offsetof(array_view, type_buf)); /* (the rest is written before it is read) */
    if (PyUnicode_Check(obj) || PyBytes_Check(obj) || PyByteArray_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: expected token ids or an array, got %.100s", arg,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (PyObject_CheckBuffer(obj))
        return view_from_buffer(obj, arg, av) < 0 ? -1 : 1;
    if (PyList_CheckExact(obj) || PyTuple_CheckExact(obj) || PyLong_CheckExact(obj) ||
        PyType_Check(obj))
        return 0;
    method = PyObject_GetAttrString(obj, "__dlpack__"); /* may run __getattr__ */
    if (method == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    rc = view_from_dlpack(obj, method, arg, av);
    Py_DECREF(method);
    return rc < 0 ? -1 : 1;
}

/* ============================================================ token inputs */

typedef struct {
    const void *data; /* int32 (is32) or int64 elements, contiguous, aligned */
    int is32;
    size_t len;
    int gil_free_ok;  /* data is owned or a buffer export */
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

/* Element i of a token input. */
static inline int64_t token_at(const token_input *ti, size_t i)
{
    return ti->is32 ? ((const int32_t *)ti->data)[i] : ((const int64_t *)ti->data)[i];
}

/* One id from p (any alignment): kind 'i' or 'u', itemsize 1, 2, 4 or 8.
 * -1 (ValueError) for an unsigned id above INT64_MAX. */
static int load_id(const char *p, char kind, int itemsize, const char *arg, int64_t *out)
{
    if (kind == 'i') {
        switch (itemsize) {
        case 1: *out = *(const int8_t *)p; return 0;
        case 2: { int16_t x; memcpy(&x, p, 2); *out = x; return 0; }
        case 4: { int32_t x; memcpy(&x, p, 4); *out = x; return 0; }
        default: memcpy(out, p, 8); return 0;
        }
    } else {
        uint64_t u;
        switch (itemsize) {
        case 1: u = *(const uint8_t *)p; break;
        case 2: { uint16_t x; memcpy(&x, p, 2); u = x; break; }
        case 4: { uint32_t x; memcpy(&x, p, 4); u = x; break; }
        default: memcpy(&u, p, 8);
        }
        if (u > (uint64_t)INT64_MAX) {
            PyErr_Format(PyExc_ValueError, "%s: token id %llu does not fit in int64", arg,
                         (unsigned long long)u);
            return -1;
        }
        *out = (int64_t)u;
        return 0;
    }
}

/* obj as an int (a new reference) through __index__, which may run Python
 * code: call it before any view of caller memory is taken. A float, an
 * object without __index__ and (refuse_bool) a bool are a TypeError; an
 * error from __index__ is replaced as error_type (NULL: see
 * raise_from_pending) if it may be. fmt takes arg and the type's name. */
static PyObject *int_from_index(PyObject *obj, const char *arg, int refuse_bool,
                                PyObject *error_type, const char *fmt)
{
    PyObject *index;
    if ((refuse_bool && PyBool_Check(obj)) || PyFloat_Check(obj) || !PyIndex_Check(obj)) {
        PyErr_Format(PyExc_TypeError, fmt, arg, Py_TYPE(obj)->tp_name);
        return NULL;
    }
    index = PyNumber_Index(obj);
    if (index == NULL && error_is_replaceable(0))
        raise_from_pending(error_type, fmt, arg, Py_TYPE(obj)->tp_name);
    return index;
}

/* An id from an int or anything with __index__ (see int_from_index). */
static int id_from_object(PyObject *item, const char *arg, int64_t *out)
{
    int overflow = 0;
    long long v;
    PyObject *index;
    if (PyLong_CheckExact(item)) {
        v = PyLong_AsLongLongAndOverflow(item, &overflow);
    } else {
        index = int_from_index(item, arg, 1, NULL, "%s: expected int token ids, got %.100s");
        if (index == NULL)
            return -1;
        v = PyLong_AsLongLongAndOverflow(index, &overflow);
        Py_DECREF(index);
    }
    if (overflow) {
        PyErr_Format(PyExc_ValueError, "%s: token id does not fit in int64", arg);
        return -1;
    }
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = (int64_t)v;
    return 0;
}

/* A buffer of token ids is 1-D (0-d: one id, where allow_scalar), C-contiguous
 * and of integers in native byte order; anything else is refused here. (A
 * DLPack tensor may be [1, L] and strided: it is checked field by field.) */
static int token_buffer_check(PyObject *obj, const array_view *av, const char *arg,
                              int allow_scalar)
{
#define EXPECTED "%s: expected a 1-D C-contiguous integer buffer in native byte order, got "
    const char *type = Py_TYPE(obj)->tp_name;
    if (av->kind != 'i' && av->kind != 'u')
        PyErr_Format(PyExc_TypeError, EXPECTED "%s%s (%.100s)", arg, av->type_name,
                     av->kind == 'x' ? "" : " elements", type);
    else if (av->ndim == 1 && av->shape[0] > 1 && av->strides[0] != av->itemsize)
        PyErr_Format(PyExc_ValueError, EXPECTED "a strided view (%.100s)", arg, type);
    else if (!(av->ndim == 1 || (av->ndim == 0 && allow_scalar)))
        PyErr_Format(PyExc_ValueError, EXPECTED "%d dimensions (%.100s)", arg, av->ndim, type);
    else
        return 0;
    return -1;
#undef EXPECTED
}

static int tokens_from_array(PyObject *obj, token_input *ti, const char *arg, int allow_scalar)
{
    array_view *av = &ti->av;
    Py_ssize_t n, stride, i;
    if (av->capsule == NULL && token_buffer_check(obj, av, arg, allow_scalar) < 0)
        return -1;
    if (av->kind != 'i' && av->kind != 'u') {
        PyErr_Format(PyExc_TypeError, "%s: expected integer token ids, got %s elements", arg,
                     av->type_name);
        return -1;
    }
    if (av->ndim == 0 && allow_scalar) {
        n = 1;
        stride = av->itemsize;
    } else if (av->ndim == 1) {
        n = av->shape[0];
        stride = av->strides[0];
    } else if (av->ndim == 2) {
        if (av->shape[0] != 1) {
            PyErr_Format(PyExc_ValueError,
                         "%s: batch size %zd is not supported (expected shape [1, L] or [L])", arg,
                         av->shape[0]);
            return -1;
        }
        n = av->shape[1];
        stride = av->strides[1];
    } else {
        PyErr_Format(PyExc_ValueError,
                     "%s: expected a 1-D [L] or 2-D [1, L] array, got %d dimensions", arg,
                     av->ndim);
        return -1;
    }
    ti->len = (size_t)n;
    if (av->kind == 'i' && (av->itemsize == 8 || av->itemsize == 4) &&
        (stride == av->itemsize || n <= 1) && is_aligned(av->data, av->itemsize)) {
        ti->data = av->data;
        ti->is32 = av->itemsize == 4;
        ti->gil_free_ok = av->gil_free_ok;
        return 0;
    }
    if (n > PY_SSIZE_T_MAX / (Py_ssize_t)sizeof(int64_t)) {
        PyErr_NoMemory();
        return -1;
    }
    ti->owned = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    if (ti->owned == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (i = 0; i < n; i++)
        if (load_id(av->data + i * stride, av->kind, av->itemsize, arg, &ti->owned[i]) < 0)
            return -1;
    ti->data = ti->owned;
    ti->is32 = 0;
    ti->gil_free_ok = 1;
    return 0;
}

/* A tuple of obj's items (obj a sequence), the refusal naming arg. */
static PyObject *sequence_snapshot(PyObject *obj, const char *arg)
{
    PyObject *items;
    if (!PySequence_Check(obj)) {
        PyErr_Format(PyExc_TypeError,
                     "%s: expected a tensor, an integer array or a sequence of ints, got %.100s",
                     arg, Py_TYPE(obj)->tp_name);
        return NULL;
    }
    items = PySequence_Tuple(obj); /* iteration may run Python code */
    if (items == NULL && error_is_replaceable(0))
        raise_from_pending(PyExc_TypeError,
                           "%s: expected a tensor, an integer array or a sequence of ints, got "
                           "%.100s that cannot be read as one",
                           arg, Py_TYPE(obj)->tp_name);
    return items;
}

static int tokens_from_sequence(PyObject *obj, token_input *ti, const char *arg)
{
    PyObject *items = sequence_snapshot(obj, arg), *first;
    Py_ssize_t n, i;
    int rc = -1;
    if (items == NULL)
        return -1;
    n = PyTuple_GET_SIZE(items);
    first = n > 0 ? PyTuple_GET_ITEM(items, 0) : NULL;
    if (first != NULL && (PyList_Check(first) || PyTuple_Check(first))) {
        PyObject *row;
        if (n != 1) {
            PyErr_Format(PyExc_ValueError,
                         "%s: batch size %zd is not supported (expected one row)", arg, n);
            goto error;
        }
        row = sequence_snapshot(first, arg);
        if (row == NULL)
            goto error;
        Py_SETREF(items, row);
        n = PyTuple_GET_SIZE(items);
    }
    ti->owned = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    if (ti->owned == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    for (i = 0; i < n; i++) /* the tuple keeps every item alive meanwhile */
        if (id_from_object(PyTuple_GET_ITEM(items, i), arg, &ti->owned[i]) < 0)
            goto error;
    ti->data = ti->owned;
    ti->len = (size_t)n;
    ti->gil_free_ok = 1;
    rc = 0;
error:
    Py_DECREF(items);
    return rc;
}

/* Fill ti from a DLPack tensor, a buffer, a sequence or (allow_scalar) an
 * int, anything else with __index__, or a 0-d integer array. */
static int token_input_get(PyObject *obj, const char *arg, int allow_scalar, token_input *ti)
{
    int got = 0;
    memset(ti, 0, sizeof(*ti));
    if (obj == Py_None) {
        PyErr_Format(PyExc_TypeError, "%s: expected token ids, got None", arg);
        return -1;
    }
    if (!(allow_scalar && PyLong_Check(obj)))
        got = array_view_get(obj, arg, &ti->av);
    if (got > 0)
        got = tokens_from_array(obj, ti, arg, allow_scalar);
    else if (got == 0 && allow_scalar && PyIndex_Check(obj) && !PySequence_Check(obj)) {
        got = id_from_object(obj, arg, &ti->scalar);
        ti->data = &ti->scalar;
        ti->len = 1;
        ti->gil_free_ok = 1;
    } else if (got == 0)
        got = tokens_from_sequence(obj, ti, arg);
    if (got < 0) {
        token_input_release(ti);
        return -1;
    }
    return 0;
}

/* The ids of obj copied into memory the caller owns (PyMem_Free); *len
 * receives their number. Nothing of obj is held afterwards, so later
 * conversions may run Python code. */
static int64_t *ids_copy(PyObject *obj, const char *arg, size_t *len)
{
    token_input ti;
    int64_t *ids;
    size_t i;
    if (token_input_get(obj, arg, 0, &ti) < 0)
        return NULL;
    ids = ti.owned; /* the conversion's own copy, when it made one */
    ti.owned = NULL;
    if (ids == NULL && (ids = PyMem_Malloc((ti.len + 1) * sizeof(int64_t))) == NULL)
        PyErr_NoMemory();
    else if (ids != ti.data)
        for (i = 0; i < ti.len; i++)
            ids[i] = token_at(&ti, i);
    *len = ti.len;
    token_input_release(&ti);
    return ids;
}

/* ============================================================ float inputs */

typedef struct {
    const void *data; /* rows x vocab, C order, aligned */
    pld_float_type ftype;
    size_t rows, vocab;
    int gil_free_ok;
    array_view av;
    void *owned;
} float_input;

static void float_input_release(float_input *fi)
{
    array_view_release(&fi->av);
    PyMem_Free(fi->owned);
    fi->owned = NULL;
}

/* A [rows, V] or [1, rows, V] float32/float16/bfloat16 array, read in place
 * when contiguous and aligned, else copied. Take it last: see the rules. */
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
    got = array_view_get(obj, arg, av);
    if (got < 0) {
        array_view_release(av);
        return -1;
    }
    if (got == 0) {
        PyErr_Format(PyExc_TypeError, "%s: expected a tensor or array of shape [k+1, V], got %.100s",
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
        PyErr_Format(PyExc_TypeError, "%s: expected float32, float16 or bfloat16 elements, got %s",
                     arg, av->type_name);
        return -1;
    }
    if (av->ndim == 3 && av->shape[0] != 1) {
        PyErr_Format(PyExc_ValueError,
                     "%s: batch size %zd is not supported (expected [1, k+1, V] or [k+1, V])", arg,
                     av->shape[0]);
        return -1;
    }
    if (av->ndim != 2 && av->ndim != 3) {
        PyErr_Format(PyExc_ValueError,
                     "%s: expected shape [k+1, V] or [1, k+1, V], got %d dimensions", arg,
                     av->ndim);
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
    if (vs == av->itemsize && (rs == vocab * av->itemsize || rows <= 1) &&
        is_aligned(av->data, av->itemsize)) {
        fi->data = av->data;
        fi->gil_free_ok = av->gil_free_ok;
        return 0;
    }
    if (rows > 0 && vocab > PY_SSIZE_T_MAX / av->itemsize / rows) {
        PyErr_NoMemory();
        return -1;
    }
    fi->owned = PyMem_Malloc((size_t)(rows > 0 ? rows : 1) * (size_t)vocab * av->itemsize);
    if (fi->owned == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (r = 0; r < rows; r++)
        for (v = 0; v < vocab; v++)
            memcpy((char *)fi->owned + (r * vocab + v) * av->itemsize, av->data + r * rs + v * vs,
                   (size_t)av->itemsize);
    fi->data = fi->owned;
    fi->gil_free_ok = 1;
    return 0;
}

/* =========================================================== small parsers */

/* An int in [min, max] from an int or anything with __index__ (NumPy
 * integers, 0-d integer arrays); bool and float are refused. */
static int parse_size(PyObject *obj, const char *arg, Py_ssize_t min, Py_ssize_t max,
                      size_t *out)
{
    PyObject *index;
    Py_ssize_t v;
    if (PyLong_CheckExact(obj)) { /* the per-step case, e.g. propose(k) */
        v = PyLong_AsSsize_t(obj);
        if (!(v == -1 && PyErr_Occurred()) && v >= min && v <= max) {
            *out = (size_t)v;
            return 0;
        }
        PyErr_Clear(); /* only an OverflowError: it is reported below */
    }
    index = int_from_index(obj, arg, 1, PyExc_TypeError, "%s must be an int, got %.100s");
    if (index == NULL)
        return -1;
    v = PyLong_AsSsize_t(index);
    if (v == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
            Py_DECREF(index);
            return -1;
        }
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be between %zd and %zd, got %R", arg, min, max,
                     index);
        Py_DECREF(index);
        return -1;
    }
    Py_DECREF(index);
    if (v < min || v > max) {
        PyErr_Format(PyExc_ValueError, "%s must be between %zd and %zd, got %zd", arg, min, max, v);
        return -1;
    }
    *out = (size_t)v;
    return 0;
}

/* obj, an int (PyLong_Check'ed by the caller: no Python code runs), as a
 * Py_ssize_t: 0, or -1 with a ValueError naming fname and arg where it
 * does not fit (PyLong_AsSsize_t's OverflowError replaced: ours). */
static int ssize_in_range(PyObject *obj, const char *fname, const char *arg, Py_ssize_t *out)
{
    *out = PyLong_AsSsize_t(obj);
    if (*out == -1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s: %s is out of range, got %R", fname, arg, obj);
        }
        return -1;
    }
    return 0;
}

/* obj, an exact int (so no Python code runs) >= min, as a Py_ssize_t:
 * 0, or -1 with a TypeError/ValueError naming fname and arg. */
static int exact_ssize(PyObject *obj, const char *fname, const char *arg, Py_ssize_t min, Py_ssize_t *out)
{
    if (!PyLong_CheckExact(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be an int, got %.100s", fname, arg, Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (ssize_in_range(obj, fname, arg, out) < 0)
        return -1;
    if (*out < min) {
        PyErr_Format(PyExc_ValueError, "%s: %s must be >= %zd, got %zd", fname, arg, min, *out);
        return -1;
    }
    return 0;
}

/* A seed in [0, 2^64) from an int or anything with __index__. */
static int parse_seed(PyObject *obj, const char *arg, uint64_t *out)
{
    PyObject *index = int_from_index(obj, arg, 1, PyExc_TypeError,
                                     "%s must be an int in [0, 2**64) or None, got %.100s");
    unsigned long long v;
    if (index == NULL)
        return -1;
    v = PyLong_AsUnsignedLongLong(index);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s must be in [0, 2**64), got %R", arg, index);
        }
        Py_DECREF(index);
        return -1;
    }
    Py_DECREF(index);
    *out = (uint64_t)v;
    return 0;
}

/* 64 bits from the operating system's generator (time and addresses mixed
 * through splitmix64 where there is none). */
static uint64_t random_u64(void)
{
    static uint64_t counter;
    uint64_t x = 0, z;
#ifdef __linux__
    if (getrandom(&x, sizeof(x), GRND_NONBLOCK) == (ssize_t)sizeof(x))
        return x;
    x ^= (uint64_t)getpid() << 32;
#endif
    x ^= (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20) ^ (uint64_t)(uintptr_t)&x;
    z = x + (++counter) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
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

/* The ids of eos (an int or a sequence of them) copied into oh->opts.eos. */
static int copy_eos(PyObject *eos, opts_holder *oh)
{
    token_input ti;
    size_t i;
    int64_t *dst;
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
    dst = oh->eos_heap ? oh->eos_heap : oh->eos_small;
    for (i = 0; i < ti.len; i++)
        dst[i] = token_at(&ti, i);
    oh->opts.eos = dst;
    oh->opts.n_eos = ti.len;
    token_input_release(&ti);
    return 0;
}

static int parse_opts(PyObject *semantics, PyObject *max_length, PyObject *eos,
                      opts_holder *oh)
{
    memset(oh, 0, sizeof(*oh));
    oh->opts.max_length = -1;
    if (parse_semantics(semantics, &oh->opts.semantics) < 0)
        return -1;
    if (max_length != NULL && max_length != Py_None) {
        size_t v;
        if (oh->opts.semantics != PLD_TRANSFORMERS) {
            PyErr_SetString(PyExc_ValueError,
                            "max_length applies only with semantics='transformers'");
            return -1;
        }
        if (parse_size(max_length, "max_length", 0, PY_SSIZE_T_MAX, &v) < 0)
            return -1;
        oh->opts.max_length = (int64_t)v;
    }
    if (eos != NULL && eos != Py_None) {
        if (oh->opts.semantics != PLD_TRANSFORMERS) {
            PyErr_SetString(PyExc_ValueError,
                            "eos_token_id applies only with semantics='transformers'");
            return -1;
        }
        return copy_eos(eos, oh);
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
 *                 semantics, max_length, eos_token_id[, with_ids])
 *   -> (start, count) or, with_ids true, (start, count, draft ids)
 * The draft is row[start:start+count] of the input's only row, as the binding
 * read it (with_ids: for inputs that cannot be sliced, or that Python code
 * may have changed since). */
static PyObject *py_find_candidate(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    token_input ti;
    opts_holder oh;
    size_t max_n, k, min_n, start = 0, count = 0, i;
    pld_status st = PLD_OK;
    int with_ids = 0;
    PyObject *ids = NULL;
    (void)self;
    if (nargs != 7 && nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "_find_candidate() takes 7 or 8 arguments");
        return NULL;
    }
    if (nargs == 8 && (with_ids = PyObject_IsTrue(args[7])) < 0)
        return NULL;
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
    PLD_MAYBE_WITHOUT_GIL(
        ti.gil_free_ok && ti.len >= PLD_NOGIL_MIN_ELEMENTS,
        st = ti.is32 ? pld_find_candidate_i32(ti.data, ti.len, min_n, max_n, k, &oh.opts, &start, &count)
                     : pld_find_candidate_i64(ti.data, ti.len, min_n, max_n, k, &oh.opts, &start, &count));
    if (st == PLD_OK && with_ids && (ids = PyList_New((Py_ssize_t)count)) != NULL) {
        for (i = 0; i < count; i++) {
            PyObject *item = PyLong_FromLongLong(token_at(&ti, start + i));
            if (item == NULL) {
                Py_CLEAR(ids);
                break;
            }
            PyList_SET_ITEM(ids, (Py_ssize_t)i, item);
        }
    }
    token_input_release(&ti);
    opts_release(&oh);
    if (st != PLD_OK)
        return raise_status(st, "find_candidate_pred_tokens");
    if (!with_ids)
        return Py_BuildValue("(nn)", (Py_ssize_t)start, (Py_ssize_t)count);
    return ids == NULL ? NULL : Py_BuildValue("(nnN)", (Py_ssize_t)start, (Py_ssize_t)count, ids);
}

/* ============================================================== NgramIndex */

/* Drafts repeat the ids of frequent tokens: a process-wide table keeps one
 * int object per id in [0, PLD_INT_CACHE_IDS) once a draft has carried it,
 * so propose() reuses it instead of allocating one per draft token (other
 * ids are allocated as usual). The table (1 MiB of pointers) is written
 * at import (pld_alloc_written): calloc'ed, each of its pages took two
 * faults in the middle of the step whose draft first touched it, tens of
 * microseconds a step over a process's first few hundred drafts. It holds
 * at most one object per id of the vocabulary in use (32 bytes each: 1.6
 * MB for every id of a 50k vocabulary). The GIL guards it. */
#define PLD_INT_CACHE_IDS ((int64_t)1 << 17)

#if defined(__GNUC__) || defined(__clang__)
#define PLD_PREFETCH_READ(p) __builtin_prefetch(p)
#define PLD_PREFETCH_WRITE(p) __builtin_prefetch(p, 1)
#else
#define PLD_PREFETCH_READ(p) ((void)(p))
#define PLD_PREFETCH_WRITE(p) ((void)(p))
#endif

static PyInterpreterState *int_cache_interp; /* the main interpreter, where int_cache serves */
static PyObject **int_cache; /* PLD_INT_CACHE_IDS entries; NULL if the import could not
                              * allocate it. The main interpreter's: other interpreters
                              * build their ints as usual (see draft_list). */

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
    int in_step;        /* set while draft_rows' first pass has a row on this index */
    size_t last_ngram;  /* match size behind the last proposal (0: none) */
    size_t voters;      /* occurrences that vote on a draft (pld_index_propose_voted) */
    int int_cache_ok;   /* made in the interpreter the int cache serves */
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
    static char *kwlist[] = {"max_ngram_size", "min_ngram_size", "policy", "seed", "voters", NULL};
    PyObject *max_obj = NULL, *min_obj = NULL, *policy_obj = NULL, *seed_obj = Py_None;
    PyObject *voters_obj = NULL;
    size_t max_n = 3, min_n = 1, voters = 1;
    int policy = PLD_POLICY_FIRST, p;
    uint64_t seed;
    pld_index *fresh;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|OOO$OO:NgramIndex", kwlist, &max_obj,
                                     &min_obj, &policy_obj, &seed_obj, &voters_obj))
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
    if (voters_obj && parse_size(voters_obj, "voters", 1, PLD_MAX_VOTERS, &voters) < 0)
        return -1;
    if (voters > 1 && policy != PLD_POLICY_RECENT) {
        PyErr_Format(PyExc_ValueError, "voters (%zu) above 1 needs policy 'recent', got '%s'", voters,
                     policy_names[policy]);
        return -1;
    }
    if (seed_obj == Py_None)
        seed = random_u64();
    else if (parse_seed(seed_obj, "seed", &seed) < 0)
        return -1;
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "NgramIndex is in use by another thread");
        return -1;
    }
    fresh = pld_index_new_keyed(min_n, max_n, (pld_policy)policy, seed);
    if (fresh == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    pld_index_free(self->index); /* only once the new one exists */
    self->index = fresh;
    self->last_ngram = 0;
    self->voters = voters;
    self->int_cache_ok = int_cache != NULL && PyInterpreterState_Get() == int_cache_interp;
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
    pld_status st = PLD_OK;
    if (index_check(self) < 0)
        return NULL;
    if (PyLong_CheckExact(tokens)) { /* the per-step fast path: one token */
        int64_t t;
        if (id_from_object(tokens, "tokens", &t) < 0)
            return NULL;
        st = pld_index_extend(self->index, &t, 1);
        if (st != PLD_OK)
            return raise_status(st, "tokens");
        Py_RETURN_NONE;
    }
    if (token_input_get(tokens, "tokens", 1, &ti) < 0)
        return NULL;
    if (index_check(self) < 0) { /* the conversion ran Python code */
        token_input_release(&ti);
        return NULL;
    }
    self->busy = 1;
    PLD_MAYBE_WITHOUT_GIL(ti.gil_free_ok && ti.len >= PLD_NOGIL_MIN_ELEMENTS,
                          st = ti.is32 ? pld_index_extend_i32(self->index, ti.data, ti.len)
                                       : pld_index_extend(self->index, ti.data, ti.len));
    self->busy = 0;
    token_input_release(&ti);
    if (st != PLD_OK)
        return raise_status(st, "tokens");
    Py_RETURN_NONE;
}

/* The draft as a list of ints, the ids' int objects fetched first from the
 * int cache (use_cache: the caller runs in the interpreter it serves). */
static PyObject *draft_list(const int64_t *draft, size_t n, int use_cache)
{
    PyObject *list;
    size_t i;
    if (!use_cache)
        return list_from_i64(draft, n);
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

/* The draft of at most k tokens for the indexed sequence, as a list (the
 * scratch buffer grown to k first); sets last_ngram. */
static PyObject *index_draft(NgramIndexObject *self, size_t k, const pld_lookup_opts *opts)
{
    size_t n;
    if (k > self->draft_cap) {
        int64_t *d = PyMem_Realloc(self->draft, k * sizeof(int64_t));
        if (d == NULL)
            return PyErr_NoMemory();
        self->draft = d;
        self->draft_cap = k;
    }
    n = pld_index_propose_voted(self->index, k, self->voters, opts, self->draft, &self->last_ngram);
    return draft_list(self->draft, n, self->int_cache_ok);
}

static PyObject *NgramIndex_propose(NgramIndexObject *self, PyObject *const *args,
                                    Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"num_pred_tokens", "semantics", "max_length",
                                        "eos_token_id"};
    PyObject *a[4], *result = NULL;
    size_t k = 10;
    opts_holder oh;
    if (index_check(self) < 0)
        return NULL;
    if (nargs <= 1 && kwnames == NULL) { /* the per-step call: propose(k) */
        a[0] = nargs ? args[0] : NULL;
        a[1] = a[2] = a[3] = NULL;
    } else if (parse_fast_args("propose", args, nargs, kwnames, names, 4, 4, a) < 0) {
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
    if (index_check(self) < 0) /* the conversions above ran Python code */
        goto done;
    result = index_draft(self, k, &oh.opts);
done:
    opts_release(&oh);
    return result;
}

/* The trie's nodes as five lists (token, parent, depth, ngram, support). */
static PyObject *tree_lists(const pld_tree_node *nodes, size_t n, int use_cache)
{
    PyObject *lists[5] = {NULL, NULL, NULL, NULL, NULL}, *result = NULL;
    size_t i;
    int f;
    for (f = 0; f < 5; f++) {
        lists[f] = PyList_New((Py_ssize_t)n);
        if (lists[f] == NULL)
            goto error;
    }
    for (i = 0; i < n; i++) {
        const pld_tree_node *v = &nodes[i];
        PyObject *items[5];
        items[0] = use_cache ? cached_int(v->token) : PyLong_FromLongLong(v->token);
        items[1] = PyLong_FromLong((long)v->parent);
        items[2] = PyLong_FromUnsignedLong((unsigned long)v->depth);
        items[3] = PyLong_FromUnsignedLong((unsigned long)v->ngram);
        items[4] = PyLong_FromUnsignedLong((unsigned long)v->support);
        for (f = 0; f < 5; f++) {
            if (items[f] == NULL) {
                int g;
                for (g = 0; g < 5; g++)
                    Py_XDECREF(items[g]);
                goto error;
            }
        }
        for (f = 0; f < 5; f++)
            PyList_SET_ITEM(lists[f], (Py_ssize_t)i, items[f]);
    }
    result = PyTuple_Pack(5, lists[0], lists[1], lists[2], lists[3], lists[4]);
error:
    for (f = 0; f < 5; f++)
        Py_XDECREF(lists[f]);
    return result;
}

/* The last (at most) max_n ids of a caller's sequence, copied into tail
 * (PLD_MAX_NGRAM entries): all a lookup of its suffix n-grams reads. The
 * conversion may run Python code; nothing of obj is held afterwards. */
static int context_tail(PyObject *obj, const char *arg, size_t max_n, int64_t *tail,
                        size_t *tlen)
{
    token_input ti;
    size_t n, i;
    if (token_input_get(obj, arg, 0, &ti) < 0)
        return -1;
    n = ti.len < max_n ? ti.len : max_n;
    for (i = 0; i < n; i++)
        tail[i] = token_at(&ti, ti.len - n + i);
    *tlen = n;
    token_input_release(&ti);
    return 0;
}

/* One propose_tree call's arguments -- [context,] depth, per_ngram,
 * max_nodes, eos_token_id -- converted into memory of our own (the context's
 * last ids, the eos ids, room for the nodes) before the index or corpus is
 * read: the conversions may run Python code. */
typedef struct {
    size_t depth, per_ngram, max_nodes, tlen;
    int64_t tail[PLD_MAX_NGRAM];
    opts_holder oh;
    pld_tree_node *nodes;
} tree_call;

static void tree_call_release(tree_call *tc)
{
    PyMem_Free(tc->nodes);
    tc->nodes = NULL;
    opts_release(&tc->oh);
}

/* Parse a call of fname; with_context: its first argument is the context,
 * of which the last max_n ids are kept. 0, or -1 with an exception set and
 * nothing held. */
static int tree_call_parse(tree_call *tc, const char *fname, PyObject *const *args,
                           Py_ssize_t nargs, PyObject *kwnames, int with_context, size_t max_n)
{
    static const char *const names[] = {"context", "depth", "per_ngram", "max_nodes",
                                        "eos_token_id"};
    const int skip = with_context ? 0 : 1, count = 5 - skip;
    PyObject *given[5] = {NULL, NULL, NULL, NULL, NULL}, **a = given + skip;
    memset(tc, 0, sizeof(*tc));
    tc->per_ngram = 4;
    tc->max_nodes = 64;
    if (parse_fast_args(fname, args, nargs, kwnames, names + skip, count, count, a) < 0)
        return -1;
    if ((with_context && given[0] == NULL) || given[1] == NULL) {
        PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", fname,
                     with_context && given[0] == NULL ? "context" : "depth");
        return -1;
    }
    if (parse_size(given[1], "depth", 1, PLD_MAX_DRAFT, &tc->depth) < 0 ||
        (given[2] && parse_size(given[2], "per_ngram", 1, PLD_TREE_MAX_PER_NGRAM,
                                &tc->per_ngram) < 0) ||
        (given[3] && parse_size(given[3], "max_nodes", 0, PLD_TREE_MAX_NODES,
                                &tc->max_nodes) < 0) ||
        (given[4] != NULL && given[4] != Py_None && copy_eos(given[4], &tc->oh) < 0) ||
        (with_context && context_tail(given[0], "context", max_n, tc->tail, &tc->tlen) < 0))
        goto error;
    tc->nodes = PyMem_Malloc((tc->max_nodes ? tc->max_nodes : 1) * sizeof(pld_tree_node));
    if (tc->nodes == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    return 0;
error:
    tree_call_release(tc);
    return -1;
}

/* The call's result: the n nodes as lists, or the status raised; releases tc. */
static PyObject *tree_call_result(tree_call *tc, pld_status st, size_t n, const char *fname,
                                  int use_cache)
{
    PyObject *result = st == PLD_OK ? tree_lists(tc->nodes, n, use_cache) : raise_status(st, fname);
    tree_call_release(tc);
    return result;
}

/* propose_tree and (after: the trie after another sequence, its first
 * argument) propose_tree_after. */
static PyObject *index_tree(NgramIndexObject *self, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames, int after)
{
    const char *fname = after ? "propose_tree_after" : "propose_tree";
    tree_call tc;
    size_t n = 0;
    pld_status st;
    /* the context's last PLD_MAX_NGRAM ids, not max_n's: a conversion may
     * re-initialise the index with a larger max_n (any length is fine) */
    if (index_check(self) < 0 || tree_call_parse(&tc, fname, args, nargs, kwnames, after, PLD_MAX_NGRAM) < 0)
        return NULL;
    if (index_check(self) < 0) { /* (re-initialised by a conversion) */
        tree_call_release(&tc);
        return NULL;
    }
    st = after ? pld_index_propose_tree_after(self->index, tc.tail, tc.tlen, tc.depth,
                                              tc.per_ngram, tc.max_nodes, tc.oh.opts.eos,
                                              tc.oh.opts.n_eos, tc.nodes, &n)
               : pld_index_propose_tree(self->index, tc.depth, tc.per_ngram, tc.max_nodes,
                                        tc.oh.opts.eos, tc.oh.opts.n_eos, tc.nodes, &n);
    return tree_call_result(&tc, st, n, fname, self->int_cache_ok);
}

static PyObject *NgramIndex_propose_tree(NgramIndexObject *self, PyObject *const *args,
                                         Py_ssize_t nargs, PyObject *kwnames)
{
    return index_tree(self, args, nargs, kwnames, 0);
}

static PyObject *NgramIndex_propose_tree_after(NgramIndexObject *self, PyObject *const *args,
                                               Py_ssize_t nargs, PyObject *kwnames)
{
    return index_tree(self, args, nargs, kwnames, 1);
}

/* reserve(n) and truncate(n): parse n and run op on the index; the GIL is
 * released when n is large and the op may have that much work to do. */
static PyObject *index_sized_op(NgramIndexObject *self, PyObject *arg,
                                pld_status (*op)(pld_index *, size_t), const char *what,
                                int may_release_gil)
{
    size_t n = 0;
    pld_status st = PLD_OK;
    if (index_check(self) < 0)
        return NULL;
    if (parse_size(arg, "n", 0, PY_SSIZE_T_MAX, &n) < 0)
        return NULL;
    if (index_check(self) < 0) /* n's __index__ ran Python code */
        return NULL;
    self->busy = 1;
    PLD_MAYBE_WITHOUT_GIL(may_release_gil && n >= PLD_NOGIL_MIN_ELEMENTS, st = op(self->index, n));
    self->busy = 0;
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

static PyObject *NgramIndex_get_last_ngram(NgramIndexObject *self, void *c)
{
    (void)c;
    return PyLong_FromSize_t(self->last_ngram);
}

/* The getters of the index (which: one of these). */
enum { INDEX_NBYTES, INDEX_POLICY, INDEX_HASH_SEED, INDEX_MIN_N, INDEX_MAX_N, INDEX_VOTERS };

static PyObject *NgramIndex_get(NgramIndexObject *self, void *which)
{
    if (index_check(self) < 0)
        return NULL;
    switch ((int)(intptr_t)which) {
    case INDEX_NBYTES:
        return PyLong_FromSize_t(pld_index_nbytes(self->index) + self->draft_cap * sizeof(int64_t));
    case INDEX_POLICY: return PyUnicode_FromString(policy_names[pld_index_policy(self->index)]);
    case INDEX_HASH_SEED: return PyLong_FromUnsignedLongLong(pld_index_key(self->index));
    case INDEX_MIN_N: return PyLong_FromSize_t(pld_index_min_n(self->index));
    case INDEX_VOTERS: return PyLong_FromSize_t(self->voters);
    default: return PyLong_FromSize_t(pld_index_max_n(self->index));
    }
}

static PyObject *NgramIndex_repr(NgramIndexObject *self)
{
    if (self->index == NULL)
        return PyUnicode_FromString("<NgramIndex (uninitialised)>");
    if (self->busy) /* another thread extends it with the GIL released: its length is not ours to read */
        return PyUnicode_FromString("<NgramIndex (in use by another thread)>");
    if (self->voters > 1)
        return PyUnicode_FromFormat("NgramIndex(max_ngram_size=%zu, min_ngram_size=%zu, "
                                    "policy='%s', voters=%zu) with %zu tokens",
                                    pld_index_max_n(self->index), pld_index_min_n(self->index),
                                    policy_names[pld_index_policy(self->index)], self->voters,
                                    pld_index_len(self->index));
    return PyUnicode_FromFormat("NgramIndex(max_ngram_size=%zu, min_ngram_size=%zu, "
                                "policy='%s') with %zu tokens",
                                pld_index_max_n(self->index), pld_index_min_n(self->index),
                                policy_names[pld_index_policy(self->index)],
                                pld_index_len(self->index));
}

/* ---- A row of a caller's token array, read in place (pld.vllm's drafter) */

/* A C-contiguous buffer of integer ids of any size and sign, in the
 * machine's byte order, read as a flat run of `len` items. */
typedef struct {
    Py_buffer view;
    const char *data;
    char kind; /* 'i' or 'u' */
    int itemsize;
    Py_ssize_t len;
} id_run;

/* run from obj's buffer (TypeError naming `arg` if it is not such a one).
 * Call it after every conversion that can run Python code. */
static int id_run_get(PyObject *obj, const char *arg, id_run *run)
{
    if (PyBytes_Check(obj) || PyByteArray_Check(obj)) { /* (their bytes would pass for uint8 ids) */
        PyErr_Format(PyExc_TypeError, "%s: expected a C-contiguous array of integer ids, got %.100s", arg,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (PyObject_GetBuffer(obj, &run->view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        if (!error_is_replaceable(0))
            return -1;
        return raise_from_pending(PyExc_TypeError,
                                  "%s: expected a C-contiguous array of integer ids, got %.100s",
                                  arg, Py_TYPE(obj)->tp_name);
    }
    run->kind = buffer_kind(run->view.format);
    run->itemsize = (int)run->view.itemsize;
    if ((run->kind != 'i' && run->kind != 'u') ||
        (run->itemsize != 1 && run->itemsize != 2 && run->itemsize != 4 && run->itemsize != 8)) {
        PyErr_Format(PyExc_TypeError, "%s: expected integer ids, got buffer format '%.20s'", arg,
                     run->view.format ? run->view.format : "B");
        PyBuffer_Release(&run->view);
        return -1;
    }
    run->data = run->view.buf;
    run->len = run->view.len / run->itemsize;
    return 0;
}

/* Whether the ids run[at + i] for i in [start, stop) equal have[start:stop]
 * (an id that does not fit in int64 equals none). */
static int id_run_equal(const id_run *run, Py_ssize_t at, const int64_t *have, Py_ssize_t start,
                        Py_ssize_t stop)
{
    Py_ssize_t i;
    const char *p = run->data + (at + start) * run->itemsize;
    if (run->kind == 'i' && run->itemsize == 8)
        return stop <= start || memcmp(p, have + start, (size_t)(stop - start) * 8) == 0;
    if (run->kind == 'i' && run->itemsize == 4) { /* in blocks, each without a branch */
        for (i = start; i < stop;) {
            Py_ssize_t end = stop - i > 64 ? i + 64 : stop;
            int64_t differ = 0;
            for (; i < end; i++, p += 4) {
                int32_t x;
                memcpy(&x, p, 4);
                differ |= (int64_t)x ^ have[i];
            }
            if (differ)
                return 0;
        }
        return 1;
    }
    for (i = start; i < stop; i++, p += run->itemsize) {
        int64_t x = 0;
        if (run->kind == 'u' && run->itemsize == 8) {
            uint64_t u;
            memcpy(&u, p, 8);
            if (u > (uint64_t)INT64_MAX)
                return 0;
            x = (int64_t)u;
        } else {
            (void)load_id(p, run->kind, run->itemsize, "", &x); /* fails only for that case */
        }
        if (x != have[i])
            return 0;
    }
    return 1;
}

#define SPANS_MAX 8

/* first_unequal(rows, at, start0, stop0, ...) -> int: the first (start,
 * stop) pair for which the indexed tokens [start, stop) differ from the ids
 * rows[at + start : at + stop], or the number of pairs when none does. */
static PyObject *NgramIndex_first_unequal(NgramIndexObject *self, PyObject *const *args,
                                          Py_ssize_t nargs)
{
    Py_ssize_t bounds[2 * SPANS_MAX], at = 0, pairs, i, have_len;
    const int64_t *have;
    id_run run;
    if (nargs < 2 || (nargs - 2) % 2 != 0 || (nargs - 2) / 2 > SPANS_MAX) {
        PyErr_Format(PyExc_TypeError,
                     "first_unequal(rows, at, start, stop, ...) takes up to %d (start, stop) "
                     "pairs, got %zd arguments",
                     SPANS_MAX, nargs);
        return NULL;
    }
    /* the ints first (exact ints only: no Python code runs), then the buffer */
    pairs = (nargs - 2) / 2;
    for (i = 0; i < 1 + 2 * pairs; i++) {
        Py_ssize_t v;
        if (!PyLong_CheckExact(args[1 + i])) {
            PyErr_Format(PyExc_TypeError, "first_unequal: at, start and stop must be ints, got %.100s",
                         Py_TYPE(args[1 + i])->tp_name);
            return NULL;
        }
        if (ssize_in_range(args[1 + i], "first_unequal", i == 0 ? "at" : i % 2 ? "start" : "stop", &v) < 0)
            return NULL;
        if (i == 0)
            at = v;
        else
            bounds[i - 1] = v;
    }
    if (id_run_get(args[0], "rows", &run) < 0)
        return NULL;
    if (index_check(self) < 0) { /* (a buffer export may have run Python code) */
        PyBuffer_Release(&run.view);
        return NULL;
    }
    have = pld_index_tokens(self->index);
    have_len = (Py_ssize_t)pld_index_len(self->index);
    for (i = 0; i < pairs; i++) {
        Py_ssize_t start = bounds[2 * i], stop = bounds[2 * i + 1];
        if (at < 0 || start < 0 || stop < start || stop > have_len || at > run.len ||
            stop > run.len - at) {
            PyErr_Format(PyExc_ValueError,
                         "first_unequal: span %zd, [%zd, %zd), is outside the %zd tokens indexed "
                         "or the %zd ids of rows from %zd on",
                         i, start, stop, have_len, run.len, at);
            PyBuffer_Release(&run.view);
            return NULL;
        }
    }
    for (i = 0; i < pairs; i++)
        if (!id_run_equal(&run, at, have, bounds[2 * i], bounds[2 * i + 1]))
            break;
    PyBuffer_Release(&run.view);
    return PyLong_FromSsize_t(i);
}

/* Extend self by the ids run[at + len(self) : at + n]; the caller has
 * checked that len(self) <= n and at + n <= run->len. allow_threads: a long
 * extend may release the GIL (a caller that holds borrowed references to
 * other objects must not). 0, or -1 with an exception set. */
static int index_take(NgramIndexObject *self, const id_run *run, Py_ssize_t at, size_t n, int allow_threads)
{
    size_t len = pld_index_len(self->index), count = n - len, i;
    const char *p = run->data + (at + (Py_ssize_t)len) * run->itemsize;
    int64_t *scratch;
    pld_status st = PLD_OK;
    if (count == 0)
        return 0;
    self->busy = 1;
    if (run->kind == 'i' && run->itemsize == 4 && is_aligned(p, 4)) {
        PLD_MAYBE_WITHOUT_GIL(allow_threads && count >= PLD_NOGIL_MIN_ELEMENTS,
                              st = pld_index_extend_i32(self->index, (const int32_t *)p, count));
    } else if (run->kind == 'i' && run->itemsize == 8 && is_aligned(p, 8)) {
        PLD_MAYBE_WITHOUT_GIL(allow_threads && count >= PLD_NOGIL_MIN_ELEMENTS,
                              st = pld_index_extend(self->index, (const int64_t *)p, count));
    } else {
        scratch = PyMem_Malloc(count * sizeof(int64_t));
        if (scratch == NULL) {
            self->busy = 0;
            PyErr_NoMemory();
            return -1;
        }
        for (i = 0; i < count; i++)
            if (load_id(p + i * run->itemsize, run->kind, run->itemsize, "rows", &scratch[i]) < 0) {
                self->busy = 0;
                PyMem_Free(scratch);
                return -1;
            }
        st = pld_index_extend(self->index, scratch, count);
        PyMem_Free(scratch);
    }
    self->busy = 0;
    if (st != PLD_OK) {
        raise_status(st, "rows");
        return -1;
    }
    return 0;
}

/* The draft the index proposes after its last token, at most `want` long
 * (0: none, an empty list), with the defaults of propose(). */
static PyObject *index_follow_draft(NgramIndexObject *self, size_t want)
{
    pld_lookup_opts opts;
    if (want == 0) {
        self->last_ngram = 0;
        return PyList_New(0);
    }
    opts.semantics = PLD_SEED;
    opts.max_length = -1;
    opts.eos = NULL;
    opts.n_eos = 0;
    return index_draft(self, want, &opts);
}

/* follow(rows, at, n, want) -> list: extend by the ids rows[at + len(self) :
 * at + n] (n >= len(self)), then propose(want) (want 0: no proposal, []). */
static PyObject *NgramIndex_follow(NgramIndexObject *self, PyObject *const *args,
                                   Py_ssize_t nargs)
{
    Py_ssize_t at;
    size_t n, want, len;
    id_run run;
    PyObject *result = NULL;
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "follow(rows, at, n, want) takes 4 arguments, got %zd", nargs);
        return NULL;
    }
    if (!PyLong_CheckExact(args[2]) || !PyLong_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError, "follow: n and want must be ints");
        return NULL;
    }
    if (exact_ssize(args[1], "follow", "at", 0, &at) < 0)
        return NULL;
    if (parse_size(args[2], "n", 0, PY_SSIZE_T_MAX, &n) < 0 ||
        parse_size(args[3], "want", 0, PLD_MAX_DRAFT, &want) < 0)
        return NULL;
    if (id_run_get(args[0], "rows", &run) < 0)
        return NULL;
    if (index_check(self) < 0) /* (a buffer export may have run Python code) */
        goto done;
    len = pld_index_len(self->index);
    if (n < len) {
        PyErr_Format(PyExc_ValueError, "follow: n (%zu) is below the %zu tokens indexed", n, len);
        goto done;
    }
    if (at > run.len || (Py_ssize_t)n > run.len - at) {
        PyErr_Format(PyExc_ValueError, "follow: rows holds %zd ids, not %zu from %zd on", run.len,
                     n, at);
        goto done;
    }
    if (index_take(self, &run, at, n, 1) == 0)
        result = index_follow_draft(self, want);
done:
    PyBuffer_Release(&run.view);
    return result;
}

static PyMethodDef NgramIndex_methods[] = {
    {"extend", (PyCFunction)NgramIndex_extend, METH_O,
     "extend($self, tokens, /)\n--\n\nAppend one token id, or a sequence of ids, a 1-D C-contiguous integer\n"
     "buffer in native byte order, or a DLPack tensor ([L] or [1, L])."},
    {"propose", (PyCFunction)(void (*)(void))NgramIndex_propose, METH_FASTCALL | METH_KEYWORDS,
     "propose(num_pred_tokens=10, semantics='seed', max_length=None, eos_token_id=None)\n--\n\n"
     "The draft for the current sequence, as a list of ints (possibly empty)."},
    {"propose_tree", (PyCFunction)(void (*)(void))NgramIndex_propose_tree,
     METH_FASTCALL | METH_KEYWORDS,
     "propose_tree(depth, per_ngram=4, max_nodes=64, eos_token_id=None)\n--\n\n"
     "Several continuations of the sequence merged into a token trie (pld.h, "
     "pld_index_propose_tree): for each n-gram size from the largest, the earliest "
     "occurrence of the suffix n-gram and (policy 'recent') the newest ones, up to "
     "per_ngram; each continues for at most depth tokens, cut before an eos id; at "
     "most max_nodes nodes. Returns (tokens, parents, depths, ngrams, supports), "
     "lists with one entry a node, parents before children (parent -1: the root, "
     "i.e. the sequence's last token)."},
    {"propose_tree_after", (PyCFunction)(void (*)(void))NgramIndex_propose_tree_after,
     METH_FASTCALL | METH_KEYWORDS,
     "propose_tree_after(context, depth, per_ngram=4, max_nodes=64, eos_token_id=None)\n--\n\n"
     "The continuations, in this index's sequence, of the suffix n-grams of another\n"
     "sequence, context (a tensor, array or sequence of ids; only its last\n"
     "max_ngram_size ids are read), merged into a token trie (pld.h,\n"
     "pld_index_propose_tree_after): for each n-gram size from the largest, the\n"
     "newest per_ngram occurrences (policy 'recent') or the earliest one (the other\n"
     "policies); each continues for at most depth tokens, cut before an eos id; at\n"
     "most max_nodes nodes. Returns (tokens, parents, depths, ngrams, supports) as\n"
     "propose_tree does (parent -1: the root, i.e. context's last token)."},
    {"reserve", (PyCFunction)NgramIndex_reserve, METH_O,
     "reserve($self, n, /)\n--\n\nMake room for n more tokens, so that the next extends (n tokens in\n"
     "all) never grow a table: each then costs O(max_ngram_size) at worst, not only on\n"
     "average. A generation loop reserves the number of new tokens it may add."},
    {"truncate", (PyCFunction)NgramIndex_truncate, METH_O,
     "truncate($self, n, /)\n--\n\nKeep the first n tokens."},
    {"tokens", (PyCFunction)NgramIndex_tokens, METH_NOARGS,
     "tokens()\n--\n\nThe indexed sequence as a list of ints."},
    {"first_unequal", (PyCFunction)(void (*)(void))NgramIndex_first_unequal, METH_FASTCALL,
     "first_unequal($self, rows, at, /, *spans)\n--\n\nThe first (start, stop) pair (at most "
     "8) for which the indexed tokens [start, stop)\ndiffer from the ids rows[at + start : at + "
     "stop], or the number of pairs when none\ndoes. rows: a C-contiguous buffer of integer ids "
     "(any size and sign, native byte\norder), read flat; every span is checked (ValueError) "
     "before any is compared."},
    {"follow", (PyCFunction)(void (*)(void))NgramIndex_follow, METH_FASTCALL,
     "follow($self, rows, at, n, want, /)\n--\n\nExtend by the ids rows[at + len : at + n] (len: the "
     "tokens indexed, n >= len;\nrows as for first_unequal), then return propose(want) "
     "(want 0: [], no lookup).\nOne call for a step of a row that grew in a caller's token "
     "array."},
    {NULL, NULL, 0, NULL}};

/* A read-only attribute: fn(self, which) serves several. */
#define GETTER(name, fn, which, doc) \
    {name, (getter)fn, NULL, doc, (void *)(intptr_t)(which)}

static PyGetSetDef NgramIndex_getset[] = {
    GETTER("nbytes", NgramIndex_get, INDEX_NBYTES, "Heap bytes owned by the index."),
    GETTER("policy", NgramIndex_get, INDEX_POLICY, "The match policy."),
    GETTER("hash_seed", NgramIndex_get, INDEX_HASH_SEED,
           "The key of the index's hash (random unless given as seed=): ids crafted to collide\n"
           "under one key do not collide under another."),
    GETTER("min_ngram_size", NgramIndex_get, INDEX_MIN_N, "Smallest n-gram size."),
    GETTER("max_ngram_size", NgramIndex_get, INDEX_MAX_N, "Largest n-gram size."),
    GETTER("voters", NgramIndex_get, INDEX_VOTERS,
           "How many of the newest valid occurrences of the matched n-gram vote on each draft\n"
           "token (pld_index_propose_voted); 1: the newest alone."),
    GETTER("last_ngram", NgramIndex_get_last_ngram, 0,
           "Size of the n-gram match behind the last proposal (0: it proposed nothing)."),
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
    .tp_doc = "NgramIndex(max_ngram_size=3, min_ngram_size=1, policy='first', *, seed=None, voters=1)\n"
              "--\n\n"
              "An incremental n-gram index over one growing token sequence.\n\n"
              "seed keys the index's hash (an int in [0, 2**64)); None draws a random key, so\n"
              "ids crafted to collide cannot make extend slow. Proposals never depend on it.\n\n"
              "voters (1..MAX_VOTERS; above 1 only with policy 'recent'): the newest valid\n"
              "occurrences of the matched n-gram vote on each draft token, the most given\n"
              "token wins (a tie: the newest's), and only those that gave it go on; 1 drafts\n"
              "what followed the newest valid occurrence.",
    .tp_methods = NgramIndex_methods,
    .tp_getset = NgramIndex_getset,
    .tp_init = (initproc)NgramIndex_init,
    .tp_new = PyType_GenericNew,
};

/* ============================================================== DraftState */

/* One request's drafting state in pld.vllm's drafter, and the step over
 * every row of a vLLM batch (draft_rows). The drafter subclasses DraftState
 * in Python and keeps its rare paths there (a new, moved or resumed request,
 * truncation, the corpus); a step in which every row is still the request
 * last seen there runs here, in one call. */

/* The row check: the first DRAFT_HEAD tokens, the last DRAFT_TAIL of what
 * the state holds, and a rolling window of DRAFT_WINDOW (pld.vllm). */
#define DRAFT_HEAD 16
#define DRAFT_TAIL 32
#define DRAFT_WINDOW 256
/* pld.acceptance_buckets: the origin of a row's own text, and the n-gram
 * and support buckets. */
#define BUCKET_ROW 0
#define NGRAM_BUCKETS 4
#define SUPPORT_BUCKETS 3

typedef struct {
    PyObject_HEAD
    NgramIndexObject *index; /* the request's tokens (NULL until __init__) */
    Py_ssize_t cursor;       /* where the rolling check goes on */
    Py_ssize_t proposed;     /* tokens of the last draft vLLM has not answered (0: none) */
    int support;             /* its chains' support bucket, 1..SUPPORT_BUCKETS */
    double predicted;        /* tokens the budget expected of that draft */
    PyObject *candidate;     /* that draft's bucket: None or (origin, ngram, support, length) */
} DraftStateObject;

static PyTypeObject DraftStateType;

static int DraftState_init(DraftStateObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"index", NULL};
    PyObject *index;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!:DraftState", kwlist, &NgramIndexType, &index))
        return -1;
    Py_INCREF(index);
    Py_XSETREF(self->index, (NgramIndexObject *)index);
    Py_INCREF(Py_None);
    Py_XSETREF(self->candidate, Py_None);
    self->cursor = 0;
    self->proposed = 0;
    self->support = 1;
    self->predicted = 0.0;
    return 0;
}

static void DraftState_dealloc(DraftStateObject *self)
{
    Py_CLEAR(self->index);
    Py_CLEAR(self->candidate);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int draft_state_check_ready(DraftStateObject *self)
{
    if (self->index == NULL) {
        PyErr_SetString(PyExc_ValueError, "DraftState is not initialised");
        return -1;
    }
    return index_check(self->index);
}

/* The row check of the request's tokens against the ids run[at:] of a row
 * holding `limit` of them (the caller has checked that at + min(len,
 * limit) <= run->len): 0 if the head or the tail differs (the cursor
 * stays), 1 if only the window does, 2 if all match (then, and for 1, the
 * cursor moves on past the window). */
static int draft_state_check(DraftStateObject *self, const id_run *run, Py_ssize_t at,
                             Py_ssize_t limit)
{
    const int64_t *have = pld_index_tokens(self->index->index);
    Py_ssize_t held = (Py_ssize_t)pld_index_len(self->index->index);
    Py_ssize_t m = held < limit ? held : limit;
    Py_ssize_t c = self->cursor >= 0 && self->cursor < m ? self->cursor : 0;
    Py_ssize_t e = c + DRAFT_WINDOW < m ? c + DRAFT_WINDOW : m;
    if (!id_run_equal(run, at, have, 0, m < DRAFT_HEAD ? m : DRAFT_HEAD) ||
        !id_run_equal(run, at, have, m > DRAFT_TAIL ? m - DRAFT_TAIL : 0, m))
        return 0;
    self->cursor = e;
    return id_run_equal(run, at, have, c, e) ? 2 : 1;
}

/* seems(rows, at, limit) -> bool */
static PyObject *DraftState_seems(DraftStateObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t at, limit, held;
    id_run run;
    int got;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "seems(rows, at, limit) takes 3 arguments, got %zd", nargs);
        return NULL;
    }
    if (exact_ssize(args[1], "seems", "at", 0, &at) < 0 || exact_ssize(args[2], "seems", "limit", 0, &limit) < 0)
        return NULL;
    if (id_run_get(args[0], "rows", &run) < 0)
        return NULL;
    if (draft_state_check_ready(self) < 0) {
        PyBuffer_Release(&run.view);
        return NULL;
    }
    held = (Py_ssize_t)pld_index_len(self->index->index);
    if (at > run.len || (held < limit ? held : limit) > run.len - at) {
        PyErr_Format(PyExc_ValueError, "seems: rows holds %zd ids, not %zd from %zd on", run.len,
                     held < limit ? held : limit, at);
        PyBuffer_Release(&run.view);
        return NULL;
    }
    got = draft_state_check(self, &run, at, limit);
    PyBuffer_Release(&run.view);
    return PyBool_FromLong(got == 2);
}

static PyObject *DraftState_get_n(DraftStateObject *self, void *c)
{
    (void)c;
    if (draft_state_check_ready(self) < 0)
        return NULL;
    return PyLong_FromSize_t(pld_index_len(self->index->index));
}

static PyObject *DraftState_get_candidate(DraftStateObject *self, void *c)
{
    (void)c;
    PyObject *candidate = self->candidate ? self->candidate : Py_None;
    Py_INCREF(candidate);
    return candidate;
}

/* Whether obj is a candidate: a tuple of four exact ints, each in [0, 2**31). */
static int is_candidate(PyObject *obj)
{
    Py_ssize_t i;
    if (!PyTuple_CheckExact(obj) || PyTuple_GET_SIZE(obj) != 4)
        return 0;
    for (i = 0; i < 4; i++) {
        PyObject *item = PyTuple_GET_ITEM(obj, i);
        long v;
        if (!PyLong_CheckExact(item))
            return 0;
        v = PyLong_AsLong(item);
        if (v < 0 || v > INT32_MAX) {
            PyErr_Clear(); /* (an overflow: the TypeError below replaces it) */
            return 0;
        }
    }
    return 1;
}

static int DraftState_set_candidate(DraftStateObject *self, PyObject *value, void *c)
{
    (void)c;
    if (value == NULL || (value != Py_None && !is_candidate(value))) {
        PyErr_SetString(PyExc_TypeError,
                        "candidate must be None or a tuple of 4 ints (origin, ngram, support, length)");
        return -1;
    }
    Py_INCREF(value);
    Py_XSETREF(self->candidate, value);
    return 0;
}

/* ---- draft_rows: the step over every row */

/* What a step knows of a row: the ids it holds and what vLLM sampled. */
typedef struct {
    Py_ssize_t n;       /* num_tokens_no_spec */
    Py_ssize_t sampled; /* tokens sampled this step (-1: not a list) */
} row_input;

/* The outcome of the state's last draft, of which vLLM kept `accepted`
 * tokens: the support streak moves, and (outcomes a list) ((origin,
 * ngram, support), proposed, accepted, predicted) is appended to it. */
static int draft_state_fared(DraftStateObject *self, Py_ssize_t accepted, PyObject *outcomes)
{
    Py_ssize_t proposed = self->proposed;
    if (accepted > proposed)
        accepted = proposed;
    self->support = accepted == proposed ? (self->support < SUPPORT_BUCKETS ? self->support + 1
                                                                            : SUPPORT_BUCKETS)
                                         : 1;
    self->proposed = 0;
    if (outcomes != Py_None) {
        PyObject *group, *item;
        int appended;
        PyObject *candidate = self->candidate;
        if (candidate == NULL || !PyTuple_CheckExact(candidate) || PyTuple_GET_SIZE(candidate) != 4) {
            PyErr_SetString(PyExc_ValueError, "draft_rows: a state with a draft pending has no candidate");
            return -1;
        }
        Py_INCREF(candidate); /* (an allocation may collect garbage, whose finalizers could set another) */
        group = PyTuple_GetSlice(candidate, 0, 3);
        Py_DECREF(candidate);
        if (group == NULL)
            return -1;
        item = Py_BuildValue("(Nnnd)", group, proposed, accepted, self->predicted);
        if (item == NULL)
            return -1;
        appended = PyList_Append(outcomes, item);
        Py_DECREF(item);
        return appended;
    }
    return 0;
}

/* The row's candidate: (BUCKET_ROW, n-gram bucket, support bucket, length)
 * of the draft `index` (the state's) has just proposed. */
static PyObject *row_candidate(const DraftStateObject *self, const NgramIndexObject *index,
                               Py_ssize_t length)
{
    size_t ngram = index->last_ngram;
    int support = self->support < 1 ? 1 : self->support > SUPPORT_BUCKETS ? SUPPORT_BUCKETS : self->support;
    return Py_BuildValue("(iinn)", BUCKET_ROW, (int)(ngram < NGRAM_BUCKETS ? ngram : NGRAM_BUCKETS - 1),
                         (Py_ssize_t)support, length);
}

/* The most stop ids draft_rows takes. */
#define DRAFT_STOP_MAX 16

/* What ends a request (draft_rows' stop ids) and where the step reports
 * the rows that sampled one. */
typedef struct {
    int64_t ids[DRAFT_STOP_MAX];
    Py_ssize_t count;
    PyObject *ended; /* a list, made when a row first ends (NULL: none has) */
} stop_ids;

/* Reads stop, an exact tuple of at most DRAFT_STOP_MAX exact ints (so no
 * Python code runs), into out->ids: 0, or -1 with a TypeError/ValueError. */
static int stop_ids_get(PyObject *stop, stop_ids *out)
{
    Py_ssize_t i;
    if (!PyTuple_CheckExact(stop) || PyTuple_GET_SIZE(stop) > DRAFT_STOP_MAX) {
        PyErr_Format(PyExc_TypeError, "draft_rows: stop_ids must be a tuple of at most %d ints",
                     DRAFT_STOP_MAX);
        return -1;
    }
    out->count = PyTuple_GET_SIZE(stop);
    for (i = 0; i < out->count; i++) {
        PyObject *item = PyTuple_GET_ITEM(stop, i);
        long long v;
        if (!PyLong_CheckExact(item)) {
            PyErr_Format(PyExc_TypeError, "draft_rows: stop_ids[%zd] must be an int, got %.100s", i,
                         Py_TYPE(item)->tp_name);
            return -1;
        }
        v = PyLong_AsLongLong(item);
        if (v == -1 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError))
                return -1;
            PyErr_Clear(); /* (replaced: the ValueError names the argument) */
            PyErr_Format(PyExc_ValueError, "draft_rows: stop_ids[%zd] is out of the 64-bit range", i);
            return -1;
        }
        out->ids[i] = (int64_t)v;
    }
    return 0;
}

/* Whether one of the ids have[from:to] is a stop id. */
static int sampled_a_stop(const stop_ids *stop, const int64_t *have, Py_ssize_t from, Py_ssize_t to)
{
    Py_ssize_t i, j;
    for (i = from < 0 ? 0 : from; i < to; i++)
        for (j = 0; j < stop->count; j++)
            if (have[i] == stop->ids[j])
                return 1;
    return 0;
}

/* Appends row i to the list rows: 0, or -1 with an exception set. */
static int append_row(PyObject *rows, Py_ssize_t i)
{
    PyObject *row = PyLong_FromSsize_t(i);
    int appended;
    if (row == NULL)
        return -1;
    appended = PyList_Append(rows, row);
    Py_DECREF(row);
    return appended;
}

/* Row i ended: added to stop->ended (made now, if it is the first). 0, or
 * -1 with an exception set. */
static int stop_ids_ended(stop_ids *stop, Py_ssize_t i)
{
    if (stop->ended == NULL && (stop->ended = PyList_New(0)) == NULL)
        return -1;
    return append_row(stop->ended, i);
}

/* Pass 2 of draft_rows (every row checked and fit for this path): each
 * decoding row learns how its last draft fared, takes its new ids and
 * proposes. Fills drafts and candidates (lists of count Nones),
 * corpus_rows, and stop->ended (the rows whose sampled ids hold a stop
 * id, made at the first); returns the decoding rows, or -1 with an exception set. */
static Py_ssize_t draft_rows_follow(PyObject *states, const row_input *in, const id_run *run,
                                    Py_ssize_t width, size_t k, Py_ssize_t max_len,
                                    PyObject *outcomes, int corpus_ready, stop_ids *stop,
                                    PyObject *drafts, PyObject *candidates, PyObject *corpus_rows)
{
    Py_ssize_t i, count = PyTuple_GET_SIZE(states), decoding = 0;
    for (i = 0; i < count; i++) {
        DraftStateObject *st = (DraftStateObject *)PyTuple_GET_ITEM(states, i);
        NgramIndexObject *index;
        PyObject *draft, *candidate = NULL;
        size_t want;
        int ended;
        if (in[i].sampled == 0 || in[i].n >= max_len)
            continue;
        decoding++;
        if (st->proposed > 0 && draft_state_fared(st, in[i].sampled - 1, outcomes) < 0)
            return -1;
        want = (size_t)(max_len - in[i].n) < k ? (size_t)(max_len - in[i].n) : k;
        index = st->index; /* (held: an allocation below may run finalizers that re-init the state) */
        if (index == NULL || index_check(index) < 0 || pld_index_len(index->index) > (size_t)in[i].n) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "draft_rows: a state changed during the step");
            return -1;
        }
        Py_INCREF(index);
        draft = index_take(index, run, i * width, (size_t)in[i].n, 0) < 0 ? NULL
                                                                          : index_follow_draft(index, want);
        if (draft != NULL && PyList_GET_SIZE(draft) > 0)
            candidate = row_candidate(st, index, PyList_GET_SIZE(draft));
        ended = draft != NULL && stop->count > 0 &&
                sampled_a_stop(stop, pld_index_tokens(index->index), in[i].n - in[i].sampled, in[i].n);
        Py_DECREF(index);
        if (draft == NULL || (PyList_GET_SIZE(draft) > 0 && candidate == NULL) ||
            (ended && stop_ids_ended(stop, i) < 0)) {
            Py_XDECREF(draft);
            Py_XDECREF(candidate);
            return -1;
        }
        if (candidate != NULL) {
            PyList_SetItem(candidates, i, candidate);
        } else if (corpus_ready && append_row(corpus_rows, i) < 0) {
            Py_DECREF(draft);
            return -1;
        }
        PyList_SetItem(drafts, i, draft);
    }
    return decoding;
}

/* Pass 1's last checks of row i, which passed the request check: what
 * pass 2 would refuse after changing earlier rows is refused now, before
 * any change. Its index is on no earlier row (nor its state: two rows
 * extending one index would each take the other's ids); a pending draft
 * has the candidate its outcome is filed under; its new ids fit in int64.
 * 0, or -1 with a ValueError set. */
static int row_fit_to_follow(DraftStateObject *st, const id_run *run, Py_ssize_t i, Py_ssize_t width,
                             Py_ssize_t held, const row_input *in, Py_ssize_t max_len, PyObject *outcomes)
{
    Py_ssize_t j;
    int64_t id;
    if (st->index->in_step) {
        PyErr_Format(PyExc_ValueError, "draft_rows: states[%zd]'s index is an earlier row's too", i);
        return -1;
    }
    if (in->sampled == 0 || in->n >= max_len)
        return 0; /* (pass 2 leaves the row alone) */
    if (st->proposed > 0 && outcomes != Py_None &&
        (st->candidate == NULL || !PyTuple_CheckExact(st->candidate) || PyTuple_GET_SIZE(st->candidate) != 4)) {
        PyErr_Format(PyExc_ValueError, "draft_rows: states[%zd] has a draft pending and no candidate", i);
        return -1;
    }
    for (j = held; j < in->n; j++)
        if (load_id(run->data + (i * width + j) * run->itemsize, run->kind, run->itemsize, "rows", &id) < 0)
            return -1;
    return 0;
}

/* Clears in_step on the indexes of the first `count` states. */
static void unmark_indexes(PyObject *states, Py_ssize_t count)
{
    Py_ssize_t i;
    for (i = 0; i < count; i++) {
        DraftStateObject *st = (DraftStateObject *)PyTuple_GET_ITEM(states, i);
        if (st->index != NULL)
            st->index->in_step = 0;
    }
}

/* Reads the first `count` of the lengths (a 1-D integer buffer, `lengths`)
 * and the sampled list's sizes into in[] (nothing here allocates). */
static int row_inputs(const id_run *lengths, PyObject *sampled, Py_ssize_t count, row_input *in)
{
    Py_ssize_t i;
    if (lengths->view.ndim > 1 || lengths->len < count) {
        PyErr_Format(PyExc_ValueError, "draft_rows: lengths must be 1-D with at least %zd ids, got %zd",
                     count, lengths->len);
        return -1;
    }
    if (!PyList_CheckExact(sampled) || PyList_GET_SIZE(sampled) != count) {
        PyErr_SetString(PyExc_TypeError, "draft_rows: states and sampled must be lists of one length");
        return -1;
    }
    for (i = 0; i < count; i++) {
        int64_t n;
        PyObject *item = PyList_GET_ITEM(sampled, i);
        if (load_id(lengths->data + i * lengths->itemsize, lengths->kind, lengths->itemsize, "lengths", &n) < 0) {
            PyErr_Clear(); /* (our own error: an unsigned length past int64, out of range as any other) */
            n = INT64_MAX;
        }
        in[i].n = n > PY_SSIZE_T_MAX ? PY_SSIZE_T_MAX : (Py_ssize_t)n; /* (out of range: lost) */
        in[i].sampled = PyList_CheckExact(item) ? PyList_GET_SIZE(item) : -1;
    }
    return 0;
}

/* draft_rows(states, rows, width, lengths, sampled, k, max_len, outcomes,
 * corpus_ready, stop_ids) -> list | tuple (the contract is in
 * pld/_core.pyi). */
static PyObject *py_draft_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *states = NULL, *outcomes, *lost = NULL, *drafts = NULL, *candidates = NULL,
             *corpus_rows = NULL, *result = NULL;
    Py_ssize_t count, width, i, decoding, all_sampled = 1;
    size_t k, max_len;
    row_input small[64], *in = small;
    id_run run, lengths;
    stop_ids stop;
    int slow = 0, corpus_ready, have_run = 0, have_lengths = 0, gc_was_on = 0;
    Py_ssize_t marked = 0; /* the rows of pass 1 whose index may be marked in_step */
    (void)self;
    stop.ended = NULL;
    if (nargs != 10) {
        PyErr_Format(PyExc_TypeError, "draft_rows takes 10 arguments, got %zd", nargs);
        return NULL;
    }
    if (stop_ids_get(args[9], &stop) < 0)
        return NULL;
    outcomes = args[7];
    if (outcomes != Py_None && !PyList_CheckExact(outcomes)) {
        PyErr_SetString(PyExc_TypeError, "draft_rows: outcomes must be a list or None");
        return NULL;
    }
    if (!PyBool_Check(args[8])) {
        PyErr_SetString(PyExc_TypeError, "draft_rows: corpus_ready must be a bool");
        return NULL;
    }
    corpus_ready = args[8] == Py_True;
    /* What can run Python code first (__index__, the buffer exports); the
     * lists are read only after, with the garbage collector held off (an
     * allocation could collect garbage, and a finalizer change a list), from
     * a snapshot of the states. */
    if (exact_ssize(args[2], "draft_rows", "width", 1, &width) < 0 ||
        parse_size(args[5], "k", 1, PLD_MAX_DRAFT, &k) < 0 ||
        parse_size(args[6], "max_len", 1, PY_SSIZE_T_MAX, &max_len) < 0)
        return NULL;
    if (id_run_get(args[3], "lengths", &lengths) < 0)
        return NULL;
    have_lengths = 1;
    if (id_run_get(args[1], "rows", &run) < 0)
        goto done;
    have_run = 1;
    gc_was_on = PyGC_Disable();
    if (!PyList_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "draft_rows: states and sampled must be lists of one length");
        goto done;
    }
    states = PyList_AsTuple(args[0]);
    if (states == NULL)
        goto done;
    count = PyTuple_GET_SIZE(states);
    for (i = 0; i < count; i++)
        if (!PyObject_TypeCheck(PyTuple_GET_ITEM(states, i), &DraftStateType)) {
            PyErr_Format(PyExc_TypeError, "draft_rows: states[%zd] is a %.100s, not a DraftState", i,
                         Py_TYPE(PyTuple_GET_ITEM(states, i))->tp_name);
            goto done;
        }
    if (run.len / width < count) {
        PyErr_Format(PyExc_ValueError, "draft_rows: rows holds %zd ids, not %zd rows of %zd", run.len,
                     count, width);
        goto done;
    }
    if (count > (Py_ssize_t)(sizeof(small) / sizeof(small[0]))) {
        in = PyMem_Malloc((size_t)count * sizeof(row_input));
        if (in == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    if (row_inputs(&lengths, args[4], count, in) < 0)
        goto done;
    lost = PyList_New(0);
    if (lost == NULL)
        goto done;
    for (i = 0; i < count; i++) { /* pass 1: every row is still its request? */
        DraftStateObject *st = (DraftStateObject *)PyTuple_GET_ITEM(states, i);
        Py_ssize_t held;
        if (draft_state_check_ready(st) < 0)
            goto done;
        held = (Py_ssize_t)pld_index_len(st->index->index);
        /* the same request has grown by exactly the ids sampled this step: any
         * other length is another request (or ids vLLM discarded), and sampled
         * ids not in a list have no length here; such a row is matched in full
         * on the Python path, never on the head, tail and window alone */
        if (in[i].n < 0 || in[i].n > width || in[i].sampled < 0 || in[i].n - held != in[i].sampled ||
            draft_state_check(st, &run, i * width, in[i].n) != 2) {
            PyObject *row = PyLong_FromSsize_t(i);
            if (row == NULL || PyList_Append(lost, row) < 0) {
                Py_XDECREF(row);
                goto done;
            }
            Py_DECREF(row);
            continue;
        }
        if (row_fit_to_follow(st, &run, i, width, held, &in[i], (Py_ssize_t)max_len, outcomes) < 0)
            goto done;
        st->index->in_step = 1;
        marked = i + 1;
        if (in[i].sampled == 0)
            all_sampled = 0;
        else if (in[i].n < (Py_ssize_t)max_len && held < DRAFT_HEAD)
            slow = 1; /* a key still growing */
    }
    unmark_indexes(states, marked);
    marked = 0;
    if (slow || PyList_GET_SIZE(lost) > 0) {
        result = lost;
        lost = NULL;
        goto done;
    }
    drafts = PyList_New(count);
    candidates = PyList_New(count);
    corpus_rows = PyList_New(0);
    if (drafts == NULL || candidates == NULL || corpus_rows == NULL)
        goto done;
    for (i = 0; i < count; i++) {
        Py_INCREF(Py_None);
        PyList_SET_ITEM(drafts, i, Py_None);
        Py_INCREF(Py_None);
        PyList_SET_ITEM(candidates, i, Py_None);
    }
    decoding = draft_rows_follow(states, in, &run, width, k, (Py_ssize_t)max_len, outcomes,
                                 corpus_ready, &stop, drafts, candidates, corpus_rows);
    if (decoding >= 0)
        result = Py_BuildValue("(OOOnOO)", drafts, candidates, corpus_rows, decoding,
                               all_sampled ? Py_True : Py_False, stop.ended ? stop.ended : Py_None);
done:
    if (marked > 0)
        unmark_indexes(states, marked);
    if (have_run)
        PyBuffer_Release(&run.view);
    if (have_lengths)
        PyBuffer_Release(&lengths.view);
    if (in != small)
        PyMem_Free(in);
    Py_XDECREF(states);
    Py_XDECREF(lost);
    if (gc_was_on)
        PyGC_Enable();
    Py_XDECREF(drafts);
    Py_XDECREF(candidates);
    Py_XDECREF(corpus_rows);
    Py_XDECREF(stop.ended);
    return result;
}

static PyObject *send_drafts(PyObject *const *args, Py_ssize_t nargs);

/* send_drafts(states, drafts, candidates, chosen) -> list (the contract is
 * in pld/_core.pyi). */
static PyObject *py_send_drafts(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *out;
    int gc_was_on = PyGC_Disable(); /* (no finalizer may change a list while it is read) */
    (void)self;
    out = send_drafts(args, nargs);
    if (gc_was_on)
        PyGC_Enable();
    return out;
}

/* send_drafts' work, with the garbage collector held off. */
static PyObject *send_drafts(PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *states, *drafts, *candidates, *chosen, *out;
    Py_ssize_t count, i;
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "send_drafts takes 4 arguments, got %zd", nargs);
        return NULL;
    }
    states = args[0];
    drafts = args[1];
    candidates = args[2];
    chosen = args[3];
    if (!PyList_CheckExact(states) || !PyList_CheckExact(drafts) || !PyList_CheckExact(candidates) ||
        !PyList_CheckExact(chosen)) {
        PyErr_SetString(PyExc_TypeError, "send_drafts: states, drafts, candidates and chosen must be lists");
        return NULL;
    }
    count = PyList_GET_SIZE(states);
    if (PyList_GET_SIZE(drafts) != count || PyList_GET_SIZE(candidates) != count ||
        PyList_GET_SIZE(chosen) != count) {
        PyErr_SetString(PyExc_ValueError, "send_drafts: states, drafts, candidates and chosen differ in length");
        return NULL;
    }
    /* every item checked before any state changes (no Python code runs: exact types only) */
    for (i = 0; i < count; i++) {
        PyObject *pick = PyList_GET_ITEM(chosen, i), *length, *draft = PyList_GET_ITEM(drafts, i);
        Py_ssize_t d;
        if (!PyTuple_CheckExact(pick) || PyTuple_GET_SIZE(pick) != 2 ||
            !PyLong_CheckExact(PyTuple_GET_ITEM(pick, 0)) ||
            !(PyFloat_CheckExact(PyTuple_GET_ITEM(pick, 1)) || PyLong_CheckExact(PyTuple_GET_ITEM(pick, 1)))) {
            PyErr_Format(PyExc_TypeError, "send_drafts: chosen[%zd] must be a (length, predicted) tuple of "
                         "an int and a number", i);
            return NULL;
        }
        length = PyTuple_GET_ITEM(pick, 0);
        if (ssize_in_range(length, "send_drafts", "a chosen length", &d) < 0)
            return NULL;
        if (d == 0)
            continue;
        if (PyFloat_AsDouble(PyTuple_GET_ITEM(pick, 1)) == -1.0 && PyErr_Occurred()) {
            if (PyErr_ExceptionMatches(PyExc_OverflowError)) { /* (an int too large for a double) */
                PyErr_Clear();
                PyErr_Format(PyExc_ValueError, "send_drafts: chosen[%zd]'s predicted is out of range", i);
            }
            return NULL; /* (exact types: no Python code runs) */
        }
        if (d < 0 || !PyObject_TypeCheck(PyList_GET_ITEM(states, i), &DraftStateType) ||
            !PyList_CheckExact(draft) || d > PyList_GET_SIZE(draft) ||
            !is_candidate(PyList_GET_ITEM(candidates, i))) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "send_drafts: row %zd: a length of %zd needs a DraftState, a "
                             "draft at least that long and a candidate", i, d);
            return NULL;
        }
    }
    out = PyList_New(count);
    if (out == NULL)
        return NULL;
    for (i = 0; i < count; i++) {
        PyObject *pick = PyList_GET_ITEM(chosen, i), *draft = PyList_GET_ITEM(drafts, i), *sent;
        Py_ssize_t d = PyLong_AsSsize_t(PyTuple_GET_ITEM(pick, 0));
        DraftStateObject *st = (DraftStateObject *)PyList_GET_ITEM(states, i);
        if (d == 0) {
            sent = PyList_New(0);
        } else if (d == PyList_GET_SIZE(draft)) {
            Py_INCREF(draft);
            sent = draft;
        } else {
            sent = PyList_GetSlice(draft, 0, d);
        }
        if (sent == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        if (d > 0) {
            PyObject *candidate = PyList_GET_ITEM(candidates, i);
            st->proposed = d;
            st->predicted = PyFloat_AsDouble(PyTuple_GET_ITEM(pick, 1)); /* (checked above) */
            Py_INCREF(candidate);
            Py_XSETREF(st->candidate, candidate);
        }
        PyList_SET_ITEM(out, i, sent);
    }
    return out;
}

static PyMethodDef DraftState_methods[] = {
    {"seems", (PyCFunction)(void (*)(void))DraftState_seems, METH_FASTCALL,
     "seems($self, rows, at, limit, /)\n--\n\n"
     "Whether the row of `limit` ids at flat index `at` of rows (a C-contiguous integer\n"
     "buffer) still looks like this request: its first 16 tokens, the last 32 it holds,\n"
     "then a rolling window of 256 (the cursor moves on past it once the first two match)."},
    {NULL, NULL, 0, NULL}};

static PyMemberDef DraftState_members[] = {
    {"index", T_OBJECT, offsetof(DraftStateObject, index), READONLY, "The request's NgramIndex."},
    {"cursor", T_PYSSIZET, offsetof(DraftStateObject, cursor), 0, "Where the rolling check goes on."},
    {"proposed", T_PYSSIZET, offsetof(DraftStateObject, proposed), 0,
     "Tokens of the last draft vLLM has not answered (0: none)."},
    {"support", T_INT, offsetof(DraftStateObject, support), 0,
     "Its chains' support bucket: 1 + its last drafts accepted whole in a row, at most 3."},
    {"predicted", T_DOUBLE, offsetof(DraftStateObject, predicted), 0,
     "Tokens the budget expected vLLM to accept of the last draft."},
    {NULL, 0, 0, 0, NULL}};

static PyGetSetDef DraftState_getset[] = {
    {"n", (getter)DraftState_get_n, NULL, "Tokens held (the index's length).", NULL},
    {"candidate", (getter)DraftState_get_candidate, (setter)DraftState_set_candidate,
     "The last draft's bucket: None or (origin, ngram, support, length).", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject DraftStateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pld._core.DraftState",
    .tp_basicsize = sizeof(DraftStateObject),
    .tp_dealloc = (destructor)DraftState_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "DraftState(index)\n--\n\n"
              "One request's drafting state in pld.vllm's drafter: its NgramIndex, the row\n"
              "check's cursor, and its last draft (see draft_rows).",
    .tp_methods = DraftState_methods,
    .tp_members = DraftState_members,
    .tp_getset = DraftState_getset,
    .tp_init = (initproc)DraftState_init,
    .tp_new = PyType_GenericNew,
};

/* ================================================================== Corpus */

/* One Corpus serves several Python threads at once (rows generating in
 * parallel add their outputs and look up their suffixes). Each holds a
 * PyThread lock over its pld_corpus, taken only with the GIL released
 * (CORPUS_LOCKED): a thread waiting for the lock never blocks the GIL, and
 * the thread holding it calls no Python API, so they cannot deadlock. All
 * arguments are converted, validated and copied into memory the binding
 * owns (or a buffer export, which its exporter keeps until it is released)
 * before the lock is taken. The settings are fixed at __init__ (a second __init__ is
 * refused), so their getters need no lock. */

typedef struct {
    PyObject_HEAD
    pld_corpus *corpus;      /* NULL until __init__ */
    PyThread_type_lock lock; /* guards corpus */
    size_t max_tokens, min_n, max_n, segments;
    uint64_t key;
    int int_cache_ok;        /* made in the interpreter the int cache serves */
    int64_t vocab_limit;     /* ids added must be below it; -1: unbound (guarded by lock) */
} CorpusObject;

/* Run the statement (the rest of the arguments: a block may hold commas)
 * holding the corpus's lock, the GIL released: it must not touch Python
 * objects or the Python API (PyMem_Raw* is fine). */
#define CORPUS_LOCKED(self, ...)                              \
    do {                                                      \
        Py_BEGIN_ALLOW_THREADS                                \
        PyThread_acquire_lock((self)->lock, WAIT_LOCK);       \
        __VA_ARGS__;                                          \
        PyThread_release_lock((self)->lock);                  \
        Py_END_ALLOW_THREADS                                  \
    } while (0)

static int corpus_check(CorpusObject *self)
{
    if (self->corpus == NULL || self->lock == NULL) {
        PyErr_SetString(PyExc_ValueError, "Corpus is not initialised");
        return -1;
    }
    return 0;
}

static int Corpus_init(CorpusObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"max_tokens", "min_ngram", "max_ngram", "segments", "hash_seed",
                             NULL};
    PyObject *max_obj = NULL, *min_obj = NULL, *maxn_obj = NULL, *seg_obj = NULL,
             *seed_obj = Py_None;
    size_t max_tokens = 0, min_n = 2, max_n = 4, segments = 4;
    uint64_t seed;
    pld_corpus *fresh;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|OOOO:Corpus", kwlist, &max_obj, &min_obj,
                                     &maxn_obj, &seg_obj, &seed_obj))
        return -1;
    if (parse_size(max_obj, "max_tokens", 1, (Py_ssize_t)PLD_CORPUS_MAX_TOKENS, &max_tokens) < 0)
        return -1;
    if (min_obj && parse_size(min_obj, "min_ngram", 1, PLD_MAX_NGRAM, &min_n) < 0)
        return -1;
    if (maxn_obj && parse_size(maxn_obj, "max_ngram", 1, PLD_MAX_NGRAM, &max_n) < 0)
        return -1;
    if (seg_obj && parse_size(seg_obj, "segments", 1, PLD_CORPUS_MAX_SEGMENTS, &segments) < 0)
        return -1;
    if (min_n > max_n) {
        PyErr_Format(PyExc_ValueError, "min_ngram (%zu) must not exceed max_ngram (%zu)", min_n,
                     max_n);
        return -1;
    }
    if (seed_obj == Py_None)
        seed = random_u64();
    else if (parse_seed(seed_obj, "hash_seed", &seed) < 0)
        return -1;
    if (self->lock == NULL && (self->lock = PyThread_allocate_lock()) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    /* (checked after the conversions, which may run Python code: no other
     * thread gets between this check and the assignment) */
    if (self->corpus != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Corpus is already initialised");
        return -1;
    }
    fresh = pld_corpus_new(max_tokens, min_n, max_n, segments, seed);
    if (fresh == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->corpus = fresh;
    self->max_tokens = max_tokens;
    self->min_n = min_n;
    self->max_n = max_n;
    self->segments = segments;
    self->key = seed;
    self->int_cache_ok = int_cache != NULL && PyInterpreterState_Get() == int_cache_interp;
    self->vocab_limit = -1;
    return 0;
}

static void Corpus_dealloc(CorpusObject *self)
{
    pld_corpus_free(self->corpus); /* no method runs: each holds a reference */
    if (self->lock != NULL)
        PyThread_free_lock(self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Corpus_add(CorpusObject *self, PyObject *tokens)
{
    static const char arg[] = "tokens";
    token_input ti;
    int64_t *owned = NULL, limit = -1;
    const int64_t *data;
    size_t i, beyond;
    pld_status st = PLD_OK;
    PyObject *result = NULL;
    if (corpus_check(self) < 0)
        return NULL;
    if (PyLong_Check(tokens) || PyBool_Check(tokens)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a sequence of token ids, got %.100s", arg,
                     Py_TYPE(tokens)->tp_name);
        return NULL;
    }
    if (token_input_get(tokens, arg, 0, &ti) < 0)
        return NULL;
    beyond = ti.len;
    if (ti.len > self->max_tokens) {
        PyErr_Format(PyExc_ValueError,
                     "%s: a sequence of %zu tokens is longer than the corpus's max_tokens (%zu)",
                     arg, ti.len, self->max_tokens);
        goto done;
    }
    /* the ids are checked, then added with the GIL released: read from a
     * copy of our own (the list's, or one made here), never from the
     * caller's memory, which another thread may write between the reads */
    if (ti.is32 || ti.owned == NULL || ti.data != ti.owned) {
        owned = PyMem_Malloc((ti.len ? ti.len : 1) * sizeof(int64_t));
        if (owned == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        for (i = 0; i < ti.len; i++)
            owned[i] = token_at(&ti, i);
        data = owned;
    } else {
        data = ti.data;
    }
    for (i = 0; i < ti.len; i++)
        if (data[i] < 0) {
            PyErr_Format(PyExc_ValueError,
                         "%s: token id %lld (at position %zu) is negative: ids are >= 0", arg,
                         (long long)data[i], i);
            goto done;
        }
    /* the vocabulary bound is read under the lock that _bind_vocab sets it
     * under: no id beyond it gets in, whichever thread binds meanwhile */
    CORPUS_LOCKED(self, {
        limit = self->vocab_limit;
        for (i = 0; limit >= 0 && i < ti.len && beyond == ti.len; i++)
            if (data[i] >= limit)
                beyond = i;
        if (beyond == ti.len)
            st = pld_corpus_add(self->corpus, data, ti.len);
    });
    if (beyond < ti.len) {
        PyErr_Format(PyExc_ValueError,
                     "%s: token id %lld (at position %zu) is beyond the vocabulary of %lld ids "
                     "the corpus is bound to", arg, (long long)data[beyond], beyond,
                     (long long)limit);
        goto done;
    }
    if (st != PLD_OK) {
        raise_status(st, arg);
        goto done;
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyMem_Free(owned);
    token_input_release(&ti);
    return result;
}

/* _bind_vocab(vocab_size, set): under the lock, the largest id held if it
 * is >= vocab_size (the corpus holds an id the model lacks), else -1 and,
 * when set is true and no bound is set yet, vocab_size becomes the bound
 * every later add is checked against. */
static PyObject *Corpus_bind_vocab(CorpusObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    size_t vocab;
    int set;
    int64_t top = -1;
    if (corpus_check(self) < 0)
        return NULL;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "_bind_vocab(vocab_size, set): expected 2 arguments");
        return NULL;
    }
    if (parse_size(args[0], "vocab_size", 1, PY_SSIZE_T_MAX, &vocab) < 0)
        return NULL;
    if ((set = PyObject_IsTrue(args[1])) < 0)
        return NULL;
    CORPUS_LOCKED(self, {
        top = pld_corpus_max_id(self->corpus);
        if (top >= 0 && (uint64_t)top >= (uint64_t)vocab)
            set = 0;
        else
            top = -1;
        if (set && self->vocab_limit < 0)
            self->vocab_limit = (int64_t)vocab;
    });
    return PyLong_FromLongLong(top);
}

static PyObject *Corpus_propose_tree(CorpusObject *self, PyObject *const *args, Py_ssize_t nargs,
                                     PyObject *kwnames)
{
    tree_call tc;
    size_t n = 0;
    pld_status st = PLD_OK;
    if (corpus_check(self) < 0 ||
        tree_call_parse(&tc, "propose_tree", args, nargs, kwnames, 1, self->max_n) < 0)
        return NULL;
    CORPUS_LOCKED(self, st = pld_corpus_propose_tree(self->corpus, tc.tail, tc.tlen, tc.depth,
                                                     tc.per_ngram, tc.max_nodes, tc.oh.opts.eos,
                                                     tc.oh.opts.n_eos, tc.nodes, &n));
    return tree_call_result(&tc, st, n, "propose_tree", self->int_cache_ok);
}

static PyObject *Corpus_sequence(CorpusObject *self, PyObject *arg)
{
    size_t i = 0, len = 0, held = 0;
    const int64_t *src;
    int64_t *copy = NULL;
    int nomem = 0;
    pld_status st = PLD_OK;
    PyObject *result;
    if (corpus_check(self) < 0)
        return NULL;
    if (parse_size(arg, "i", 0, PY_SSIZE_T_MAX, &i) < 0)
        return NULL;
    CORPUS_LOCKED(self, {
        held = pld_corpus_sequences(self->corpus);
        st = pld_corpus_sequence(self->corpus, i, &src, &len);
        if (st == PLD_OK) {
            copy = PyMem_RawMalloc(len * sizeof(int64_t));
            if (copy != NULL)
                memcpy(copy, src, len * sizeof(int64_t));
            else
                nomem = 1;
        }
    });
    if (st != PLD_OK) {
        PyErr_Format(PyExc_IndexError, "i: sequence %zu is out of range (%zu held)", i, held);
        return NULL;
    }
    if (nomem)
        return PyErr_NoMemory();
    result = list_from_i64(copy, len);
    PyMem_RawFree(copy);
    return result;
}

/* _export() -> (tokens, lengths, evicted): every held sequence, oldest
 * first, as two bytes objects of native int64 (the tokens one after
 * another, and each sequence's length), and the count of sequences evicted
 * before them, copied under one hold of the lock: a consistent snapshot for
 * Corpus.save and Corpus.sequences. */
static PyObject *Corpus_export(CorpusObject *self, PyObject *unused)
{
    int64_t *toks = NULL, *lens = NULL;
    size_t total = 0, count = 0;
    uint64_t evicted = 0;
    int nomem = 0;
    PyObject *result = NULL;
    (void)unused;
    if (corpus_check(self) < 0)
        return NULL;
    CORPUS_LOCKED(self, {
        size_t i, at = 0;
        total = pld_corpus_tokens(self->corpus);
        count = pld_corpus_sequences(self->corpus);
        evicted = pld_corpus_evicted(self->corpus);
        toks = PyMem_RawMalloc((total ? total : 1) * sizeof(int64_t));
        lens = PyMem_RawMalloc((count ? count : 1) * sizeof(int64_t));
        if (toks == NULL || lens == NULL) {
            nomem = 1;
        } else {
            for (i = 0; i < count; i++) {
                const int64_t *src = NULL;
                size_t len = 0;
                (void)pld_corpus_sequence(self->corpus, i, &src, &len);
                memcpy(toks + at, src, len * sizeof(int64_t));
                lens[i] = (int64_t)len;
                at += len;
            }
        }
    });
    if (nomem)
        PyErr_NoMemory();
    else
        result = Py_BuildValue("(y#y#K)", (const char *)toks, (Py_ssize_t)(total * sizeof(int64_t)),
                               (const char *)lens, (Py_ssize_t)(count * sizeof(int64_t)),
                               (unsigned long long)evicted);
    PyMem_RawFree(toks);
    PyMem_RawFree(lens);
    return result;
}

static PyObject *Corpus_clear(CorpusObject *self, PyObject *unused)
{
    (void)unused;
    if (corpus_check(self) < 0)
        return NULL;
    CORPUS_LOCKED(self, pld_corpus_clear(self->corpus));
    Py_RETURN_NONE;
}

static Py_ssize_t Corpus_len(CorpusObject *self)
{
    size_t n = 0;
    if (corpus_check(self) < 0)
        return -1;
    CORPUS_LOCKED(self, n = pld_corpus_tokens(self->corpus));
    return (Py_ssize_t)n;
}

/* The getters of state that adds change, read under the lock. */
enum { CORPUS_SEQUENCES, CORPUS_EVICTED, CORPUS_NBYTES, CORPUS_MAX_ID, CORPUS_SEGMENTS_USED };

static PyObject *Corpus_get_state(CorpusObject *self, void *which)
{
    const int w = (int)(intptr_t)which;
    uint64_t u = 0;
    int64_t id = -1;
    if (corpus_check(self) < 0)
        return NULL;
    CORPUS_LOCKED(self, {
        switch (w) {
        case CORPUS_SEQUENCES: u = pld_corpus_sequences(self->corpus); break;
        case CORPUS_EVICTED: u = pld_corpus_evicted(self->corpus); break;
        case CORPUS_NBYTES: u = pld_corpus_nbytes(self->corpus); break;
        case CORPUS_SEGMENTS_USED: u = pld_corpus_segments_used(self->corpus); break;
        default: id = pld_corpus_max_id(self->corpus); break;
        }
    });
    if (w == CORPUS_MAX_ID)
        return PyLong_FromLongLong(id);
    return PyLong_FromUnsignedLongLong(u);
}

/* The settings (fixed at __init__). */
enum { CORPUS_MAX_TOKENS, CORPUS_MIN_NGRAM, CORPUS_MAX_NGRAM, CORPUS_SEGMENTS, CORPUS_HASH_SEED };

static PyObject *Corpus_get_setting(CorpusObject *self, void *which)
{
    if (corpus_check(self) < 0)
        return NULL;
    switch ((int)(intptr_t)which) {
    case CORPUS_MAX_TOKENS: return PyLong_FromSize_t(self->max_tokens);
    case CORPUS_MIN_NGRAM: return PyLong_FromSize_t(self->min_n);
    case CORPUS_MAX_NGRAM: return PyLong_FromSize_t(self->max_n);
    case CORPUS_SEGMENTS: return PyLong_FromSize_t(self->segments);
    default: return PyLong_FromUnsignedLongLong(self->key);
    }
}

static PyObject *Corpus_repr(CorpusObject *self)
{
    size_t tokens = 0, seqs = 0;
    if (self->corpus == NULL || self->lock == NULL)
        return PyUnicode_FromString("<Corpus (uninitialised)>");
    CORPUS_LOCKED(self, {
        tokens = pld_corpus_tokens(self->corpus);
        seqs = pld_corpus_sequences(self->corpus);
    });
    return PyUnicode_FromFormat("Corpus(max_tokens=%zu, min_ngram=%zu, max_ngram=%zu, "
                                "segments=%zu) with %zu tokens in %zu sequences",
                                self->max_tokens, self->min_n, self->max_n, self->segments,
                                tokens, seqs);
}

static PyMethodDef Corpus_methods[] = {
    {"add", (PyCFunction)Corpus_add, METH_O,
     "add($self, tokens, /)\n--\n\nAdd one sequence (a list or tuple of ints, a 1-D integer tensor, a 1-D\n"
     "C-contiguous integer array in native byte order): ids >= 0 (and below the bound\n"
     "_bind_vocab set), at most max_tokens of them; an empty one is ignored. Then, while\n"
     "more than max_tokens tokens are held, the oldest segment is dropped."},
    {"_bind_vocab", (PyCFunction)(void (*)(void))Corpus_bind_vocab, METH_FASTCALL,
     "_bind_vocab($self, vocab_size, set, /)\n--\n\nThe largest id held if it is >= vocab_size, else -1;\n"
     "with set true, vocab_size becomes the bound later adds are checked against (the\n"
     "first bound stays)."},
    {"propose_tree", (PyCFunction)(void (*)(void))Corpus_propose_tree,
     METH_FASTCALL | METH_KEYWORDS,
     "propose_tree(context, depth, per_ngram=4, max_nodes=64, eos_token_id=None)\n--\n\n"
     "The continuations, in the corpus, of the suffix n-grams of context (the caller's\n"
     "sequence or its tail; only its last max_ngram ids are read), merged into one token\n"
     "trie (pld.h, pld_corpus_propose_tree): for each n-gram size from the largest, each\n"
     "segment from the newest gives its newest per_ngram occurrences; each continues for\n"
     "at most depth tokens, within its sequence, cut before an eos id; at most max_nodes\n"
     "nodes. Returns (tokens, parents, depths, ngrams, supports) as\n"
     "NgramIndex.propose_tree does. The cost does not grow with the tokens held."},
    {"sequence", (PyCFunction)Corpus_sequence, METH_O,
     "sequence($self, i, /)\n--\n\nThe i-th sequence held, oldest first, as a list of ints."},
    {"_export", (PyCFunction)Corpus_export, METH_NOARGS,
     "_export()\n--\n\n(tokens, lengths): every held sequence, oldest first, as native int64\n"
     "bytes (tokens one after another; each sequence's length), one consistent snapshot."},
    {"clear", (PyCFunction)Corpus_clear, METH_NOARGS,
     "clear()\n--\n\nDrop every sequence (not counted as evicted)."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Corpus_getset[] = {
    GETTER("num_sequences", Corpus_get_state, CORPUS_SEQUENCES, "Sequences held."),
    GETTER("evicted", Corpus_get_state, CORPUS_EVICTED,
                  "Sequences dropped so far to keep within max_tokens (clear() drops none)."),
    GETTER("nbytes", Corpus_get_state, CORPUS_NBYTES, "Heap bytes owned."),
    GETTER("max_id", Corpus_get_state, CORPUS_MAX_ID,
                  "The largest token id held; -1 when empty."),
    GETTER("segments_used", Corpus_get_state, CORPUS_SEGMENTS_USED,
                  "Segments (generations) in use."),
    GETTER("max_tokens", Corpus_get_setting, CORPUS_MAX_TOKENS,
                  "The most tokens held (separators not counted)."),
    GETTER("min_ngram", Corpus_get_setting, CORPUS_MIN_NGRAM, "Smallest n-gram size."),
    GETTER("max_ngram", Corpus_get_setting, CORPUS_MAX_NGRAM, "Largest n-gram size."),
    GETTER("segments", Corpus_get_setting, CORPUS_SEGMENTS,
                  "The most segments (generations) held."),
    GETTER("hash_seed", Corpus_get_setting, CORPUS_HASH_SEED,
                  "The key of the segments' hashes (random unless given)."),
    {NULL, NULL, NULL, NULL, NULL}};

static PySequenceMethods Corpus_as_sequence = {
    .sq_length = (lenfunc)Corpus_len,
};

static PyTypeObject CorpusType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pld._core.Corpus",
    .tp_basicsize = sizeof(CorpusObject),
    .tp_dealloc = (destructor)Corpus_dealloc,
    .tp_repr = (reprfunc)Corpus_repr,
    .tp_as_sequence = &Corpus_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Corpus(max_tokens, min_ngram=2, max_ngram=4, segments=4, hash_seed=None)\n--\n\n"
              "A bounded set of token sequences (documents, earlier outputs) to draft from,\n"
              "with a lookup whose cost does not grow with it (pld.h, \"Corpus\"). At most\n"
              "max_tokens tokens in at most `segments` generations; the oldest generation is\n"
              "dropped whole when more would be held. Safe to share between threads: every\n"
              "call holds the corpus's lock, with the GIL released.\n\n"
              "hash_seed keys the hashes (an int in [0, 2**64)); None draws a random key.",
    .tp_methods = Corpus_methods,
    .tp_getset = Corpus_getset,
    .tp_init = (initproc)Corpus_init,
    .tp_new = PyType_GenericNew,
};

/* ============================================================== acceptance */

/* A tree as the walks take it, in memory the binding owns: the tokens, the
 * parents (a chain when not given), the walk's outputs and the depth. */
typedef struct {
    int64_t *nodes, *parents, *out;
    size_t *path; /* n entries; the depths first (pld_tree_depths) */
    size_t n, depth;
} tree_args;

static void tree_args_release(tree_args *ta)
{
    PyMem_Free(ta->nodes);
    PyMem_Free(ta->parents);
    PyMem_Free(ta->out);
    PyMem_Free(ta->path);
    memset(ta, 0, sizeof(*ta));
}

/* The parents of ta->n nodes from obj (None or absent: a chain), checked. */
static int tree_parents(PyObject *obj, tree_args *ta)
{
    size_t i, len = 0;
    if (obj == NULL || obj == Py_None) {
        ta->parents = PyMem_Malloc((ta->n + 1) * sizeof(int64_t));
        if (ta->parents == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (i = 0; i < ta->n; i++)
            ta->parents[i] = (int64_t)i - 1;
        return 0;
    }
    ta->parents = ids_copy(obj, "parents", &len);
    if (ta->parents == NULL)
        return -1;
    if (len != ta->n) {
        PyErr_Format(PyExc_ValueError, "parents: expected len(tokens) = %zu values, got %zu",
                     ta->n, len);
        return -1;
    }
    for (i = 0; i < len; i++)
        if (ta->parents[i] < -1 || ta->parents[i] >= (int64_t)i) {
            PyErr_Format(PyExc_ValueError, "parents: parents[%zu] = %lld is not in [-1, %zu)", i,
                         (long long)ta->parents[i], i);
            return -1;
        }
    return 0;
}

/* tokens and parents, copied (their conversion may run Python code), and
 * room for the walk's outputs. */
static int tree_args_get(PyObject *tokens, PyObject *parents, tree_args *ta)
{
    memset(ta, 0, sizeof(*ta));
    ta->nodes = ids_copy(tokens, "tokens", &ta->n);
    if (ta->nodes == NULL || tree_parents(parents, ta) < 0)
        return -1;
    ta->path = PyMem_Malloc((ta->n + 1) * sizeof(size_t));
    ta->out = PyMem_Malloc((ta->n + 1) * sizeof(int64_t));
    if (ta->path == NULL || ta->out == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (pld_tree_depths(ta->parents, ta->n, ta->path, &ta->depth) != PLD_OK) {
        PyErr_SetString(PyExc_ValueError, "parents: invalid tree"); /* checked above */
        return -1;
    }
    return 0;
}

/* (path, accepted): the path's node indices and the m + 1 tokens. */
static PyObject *walk_result(const tree_args *ta, size_t m)
{
    PyObject *path = PyList_New((Py_ssize_t)m), *tokens;
    size_t i;
    if (path == NULL)
        return NULL;
    for (i = 0; i < m; i++) {
        PyObject *item = PyLong_FromSize_t(ta->path[i]);
        if (item == NULL) {
            Py_DECREF(path);
            return NULL;
        }
        PyList_SET_ITEM(path, (Py_ssize_t)i, item);
    }
    tokens = list_from_i64(ta->out, m + 1);
    if (tokens == NULL) {
        Py_DECREF(path);
        return NULL;
    }
    return Py_BuildValue("(NN)", path, tokens);
}

static PyObject *py_accept_greedy(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames)
{
    static const char *const names[] = {"tokens", "choices", "parents"};
    PyObject *a[3], *out = NULL;
    tree_args ta;
    int64_t *choices = NULL;
    size_t n_choices = 0, m = 0;
    pld_status st;
    (void)self;
    if (parse_fast_args("accept_greedy", args, nargs, kwnames, names, 3, 3, a) < 0)
        return NULL;
    if (a[0] == NULL || a[1] == NULL) {
        PyErr_SetString(PyExc_TypeError, "accept_greedy() needs tokens and choices");
        return NULL;
    }
    /* every argument copied as it is read: converting one may run Python code */
    if (tree_args_get(a[0], a[2], &ta) < 0)
        goto error;
    choices = ids_copy(a[1], "choices", &n_choices);
    if (choices == NULL)
        goto error;
    if (n_choices < ta.n + 1) {
        PyErr_Format(PyExc_ValueError,
                     "choices: expected at least len(tokens) + 1 = %zu ids, got %zu", ta.n + 1,
                     n_choices);
        goto error;
    }
    st = pld_accept_tree_greedy(ta.nodes, ta.parents, ta.n, choices, ta.path, ta.out, &m);
    if (st != PLD_OK)
        raise_status(st, "accept_greedy");
    else
        out = walk_result(&ta, m);
error:
    tree_args_release(&ta);
    PyMem_Free(choices);
    return out;
}

/* The uniforms, at least `need`, each in [0, 1), from a sequence (or any
 * iterable) of floats read from a snapshot (a tuple of its items), into
 * *out (PyMem_Free) and *count. */
static int parse_uniforms(PyObject *obj, size_t need, double **out, size_t *count)
{
    static const char arg[] = "uniforms";
    PyObject *items;
    Py_ssize_t i, n;
    int rc = -1;
    *out = NULL;
    if (PyUnicode_Check(obj) || PyBytes_Check(obj) || PyByteArray_Check(obj) || obj == Py_None) {
        PyErr_Format(PyExc_TypeError, "%s: expected a sequence of floats, got %.100s", arg,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    items = PySequence_Tuple(obj); /* any iterable (a tensor, an array); may run Python code */
    if (items == NULL) {
        if (error_is_replaceable(0))
            raise_from_pending(PyExc_TypeError, "%s: expected a sequence of floats, got %.100s", arg,
                               Py_TYPE(obj)->tp_name);
        return -1;
    }
    n = PyTuple_GET_SIZE(items);
    if ((size_t)n < need) {
        PyErr_Format(PyExc_ValueError,
                     "%s: expected at least 1 + the tree's depth = %zu values, got %zd", arg,
                     need, n);
        goto error;
    }
    *out = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    if (*out == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    for (i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(items, i);
        double u = PyFloat_AsDouble(item); /* may run __float__ */
        if (u == -1.0 && PyErr_Occurred()) {
            if (error_is_replaceable(0))
                raise_from_pending(NULL, "%s: expected floats, got %.100s", arg,
                                   Py_TYPE(item)->tp_name);
            goto error;
        }
        if (!(u >= 0.0 && u < 1.0)) {
            PyErr_Format(PyExc_ValueError, "%s: values must lie in [0, 1), got %R", arg, item);
            goto error;
        }
        (*out)[i] = u;
    }
    *count = (size_t)n;
    rc = 0;
error:
    if (rc < 0) {
        PyMem_Free(*out);
        *out = NULL;
    }
    Py_DECREF(items);
    return rc;
}

static PyObject *py_accept_sample(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames)
{
    static const char *const names[] = {"tokens", "probs", "uniforms", "parents"};
    PyObject *a[4], *out = NULL;
    tree_args ta;
    float_input fi;
    double *u = NULL;
    size_t n_u = 0, m = 0;
    pld_status st = PLD_OK;
    (void)self;
    memset(&fi, 0, sizeof(fi));
    if (parse_fast_args("accept_sample", args, nargs, kwnames, names, 4, 4, a) < 0)
        return NULL;
    if (a[0] == NULL || a[1] == NULL || a[2] == NULL) {
        PyErr_SetString(PyExc_TypeError, "accept_sample() needs tokens, probs and uniforms");
        return NULL;
    }
    /* every conversion that can run Python code first: tokens, parents, uniforms */
    if (tree_args_get(a[0], a[3], &ta) < 0 || parse_uniforms(a[2], ta.depth + 1, &u, &n_u) < 0)
        goto error;
    /* then the one argument read in place */
    if (float_input_get(a[1], "probs", &fi) < 0)
        goto error;
    if (fi.rows < ta.n + 1) {
        PyErr_Format(PyExc_ValueError, "probs: expected at least len(tokens) + 1 = %zu rows, got %zu",
                     ta.n + 1, fi.rows);
        goto error;
    }
    /* at most depth + 1 rows are read: a long call only over a big vocabulary */
    PLD_MAYBE_WITHOUT_GIL(
        fi.gil_free_ok && (ta.depth + 1) * fi.vocab >= PLD_NOGIL_MIN_ELEMENTS,
        st = pld_accept_tree_sample(ta.nodes, ta.parents, ta.n, fi.data, fi.ftype, fi.rows,
                                    fi.vocab, u, n_u, ta.path, ta.out, &m));
    float_input_release(&fi);
    if (st != PLD_OK)
        raise_status(st, "probs");
    else
        out = walk_result(&ta, m);
error:
    float_input_release(&fi);
    tree_args_release(&ta);
    PyMem_Free(u);
    return out;
}

/* ================================================================== module */

/* _ngram_tag(tokens, seed=0) -> int: the tag an index keyed by seed files
 * the n-gram `tokens` under. */
static PyObject *py_ngram_tag(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t *key;
    size_t n = 0;
    uint64_t seed = 0;
    PyObject *out = NULL;
    (void)self;
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "_ngram_tag(tokens, seed=0) takes 1 or 2 arguments");
        return NULL;
    }
    if (nargs == 2 && parse_seed(args[1], "seed", &seed) < 0)
        return NULL;
    key = ids_copy(args[0], "tokens", &n);
    if (key == NULL)
        return NULL;
    if (n < 1 || n > PLD_MAX_NGRAM + 1)
        PyErr_Format(PyExc_ValueError, "tokens must hold 1 to %d ids, got %zu", PLD_MAX_NGRAM + 1,
                     n);
    else
        out = PyLong_FromUnsignedLong(pld_index_ngram_tag(key, n, seed));
    PyMem_Free(key);
    return out;
}

static PyMethodDef module_methods[] = {
    {"draft_rows", (PyCFunction)(void (*)(void))py_draft_rows, METH_FASTCALL,
     "draft_rows(states, rows, width, lengths, sampled, k, max_len, outcomes, corpus_ready, stop_ids, /)\n--\n\n"
     "One step of pld.vllm's drafter over every row (see pld/_core.pyi)."},
    {"send_drafts", (PyCFunction)(void (*)(void))py_send_drafts, METH_FASTCALL,
     "send_drafts(states, drafts, candidates, chosen, /)\n--\n\n"
     "The drafts cut to the chosen lengths, their states waiting for vLLM's answer\n"
     "(see pld/_core.pyi)."},
    {"_ngram_tag", (PyCFunction)(void (*)(void))py_ngram_tag, METH_FASTCALL,
     "_ngram_tag(tokens, seed=0, /)\n--\n\nThe hash tag of an n-gram in an index keyed by seed "
     "(for tests)"},
    {"_find_candidate", (PyCFunction)(void (*)(void))py_find_candidate, METH_FASTCALL,
     "_find_candidate(input_ids, max_ngram_size, num_pred_tokens, min_ngram_size, semantics, "
     "max_length, eos_token_id, with_ids=False, /)\n--\n\n(start, count), and the draft's ids with with_ids"},
    {"accept_greedy", (PyCFunction)(void (*)(void))py_accept_greedy, METH_FASTCALL | METH_KEYWORDS,
     "accept_greedy(tokens, choices, parents=None)\n--\n\n"
     "Greedy acceptance of a verified token tree: walk from the root along the model's\n"
     "choices (choices[0] at the root, choices[1 + i] at node i; at least len(tokens) + 1\n"
     "ids), descending to the first child of the current node whose token is the choice.\n"
     "tokens: the nodes' tokens; parents: each node's parent in [-1, i) (-1: the root),\n"
     "None for a chain. Returns (path, accepted): the accepted nodes' indices, then their\n"
     "tokens and the model's token after the path (len(path) + 1 tokens)."},
    {"accept_sample", (PyCFunction)(void (*)(void))py_accept_sample, METH_FASTCALL | METH_KEYWORDS,
     "accept_sample(tokens, probs, uniforms, parents=None)\n--\n\n"
     "Exact speculative sampling of a verified token tree: the walk of accept_greedy, the\n"
     "model's token at each visited position drawn by inverse CDF from its row of probs\n"
     "([len(tokens) + 1, V] or [1, len(tokens) + 1, V] float32/float16/bfloat16, row 0 the\n"
     "root's, rows unnormalised, each visited row finite, non-negative with positive sum)\n"
     "with uniforms[d] for a position of depth d (the root 0): at least 1 + the tree's\n"
     "depth floats in [0, 1), one a depth, so the tokens are i.i.d. draws from the model.\n"
     "Returns (path, accepted) as accept_greedy."},
    {NULL, NULL, 0, NULL}};

/* Module objects alive that may use the int cache (it is freed with the
 * last one). */
static Py_ssize_t int_cache_users;

static int module_exec(PyObject *m)
{
    if (PyType_Ready(&NgramIndexType) < 0 || PyType_Ready(&DraftStateType) < 0 ||
        PyType_Ready(&CorpusType) < 0)
        return -1;
    if (PyModule_AddObjectRef(m, "NgramIndex", (PyObject *)&NgramIndexType) < 0 ||
        PyModule_AddObjectRef(m, "DraftState", (PyObject *)&DraftStateType) < 0 ||
        PyModule_AddObject(m, "DRAFT_CHECK", Py_BuildValue("(iii)", DRAFT_HEAD, DRAFT_TAIL,
                                                           DRAFT_WINDOW)) < 0 ||
        PyModule_AddObject(m, "DRAFT_BUCKETS", Py_BuildValue("(iii)", BUCKET_ROW, NGRAM_BUCKETS,
                                                             SUPPORT_BUCKETS)) < 0 ||
        PyModule_AddIntConstant(m, "DRAFT_STOP_MAX", DRAFT_STOP_MAX) < 0 ||
        PyModule_AddObjectRef(m, "Corpus", (PyObject *)&CorpusType) < 0 ||
        PyModule_AddObject(m, "CORPUS_MAX_TOKENS", PyLong_FromSize_t(PLD_CORPUS_MAX_TOKENS)) < 0 ||
        PyModule_AddIntConstant(m, "CORPUS_MAX_SEGMENTS", PLD_CORPUS_MAX_SEGMENTS) < 0 ||
        PyModule_AddIntConstant(m, "MAX_NGRAM", PLD_MAX_NGRAM) < 0 ||
        PyModule_AddIntConstant(m, "MAX_VOTERS", PLD_MAX_VOTERS) < 0 ||
        PyModule_AddIntConstant(m, "MAX_DRAFT", PLD_MAX_DRAFT) < 0 ||
        PyModule_AddObject(m, "MAX_TOKENS", PyLong_FromSize_t(PLD_INDEX_MAX_TOKENS)) < 0)
        return -1;
    /* the int cache serves the main interpreter only (see cached_int) */
    if (PyInterpreterState_Get() == PyInterpreterState_Main()) {
        if (int_cache == NULL) /* NULL: none */
            int_cache = pld_alloc_written((size_t)PLD_INT_CACHE_IDS, sizeof(PyObject *));
        int_cache_interp = PyInterpreterState_Main();
        int_cache_users++;
    }
    return 0;
}

static void module_free(void *module)
{
    (void)module;
    if (PyInterpreterState_Get() == PyInterpreterState_Main() && int_cache_users > 0 &&
        --int_cache_users == 0)
        int_cache_clear();
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, (void *)module_exec},
    {0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "pld._core", "The C core of pld.", 0,
    module_methods, module_slots, NULL, NULL, module_free};

PyMODINIT_FUNC PyInit__core(void)
{
    return PyModuleDef_Init(&module_def);
}
