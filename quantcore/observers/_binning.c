/* quantcore.observers._binning: one pass over a float batch for the histogram observers (quantcore.observers.histogram).
 *
 * scan(x, multiplier, floor, counts) reads the contiguous float32 or float64 buffer x once and returns
 * (min, max, nonfinite, overflow): the extremes of its values (NaN skipped), whether it holds a NaN or
 * an infinity, and how many values had trunc(|x * multiplier|) beyond len(counts) - 1 (not counted:
 * the caller's range was too small). On the way, every value with s = |x * multiplier| (computed in
 * x's type, as numpy's multiply and abs would) at or above `floor` is counted: counts[trunc(s)] += 1.
 * With floor = +inf it only takes the extremes.
 *
 * The loop reads one vector of values at a time (GCC vector extensions: 32 bytes with AVX2 where the
 * x86-64 CPU has it, chosen when the module loads; 16 bytes otherwise, SSE2 or NEON): min, max, the
 * NaN test and the floor test without a branch. A block of 64 values where some reach the floor is
 * read again, and those values are counted, found by their bit in the block's mask. Most values of a
 * calibration batch lie below the percentile observer's floor, so a batch costs about one read of its
 * memory. The GIL is released during the loop.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define BLOCK 64 /* values tested before the branch that looks for values to count: one uint64_t mask */

/* BINNING_NO_AVX2: the baseline build only, which the tests compile to check that code too */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(BINNING_NO_AVX2)
#define HAVE_AVX2_BUILD 1
#else
#define HAVE_AVX2_BUILD 0
#endif

typedef struct {
    double lo, hi;
    int nonfinite;
    Py_ssize_t overflow;
} Scan;

/* SCAN_KERNEL(name, T, I, ABS_MASK, BYTES, TARGET): the scan over T values in vectors of BYTES bytes,
 * I the integer type of T's width, TARGET the function's instruction-set attribute (or nothing). */
#define SCAN_KERNEL(name, T, I, ABS_MASK, BYTES, TARGET)                                                \
    enum { name##_lanes = BYTES / sizeof(T) };                                                          \
    typedef T name##_v __attribute__((vector_size(BYTES)));                                             \
    typedef I name##_i __attribute__((vector_size(BYTES)));                                             \
    static inline void name##_count(T s, T limit, int64_t *counts, Py_ssize_t *overflow) {              \
        if (s < limit)                                                                                  \
            counts[(int64_t)s] += 1;                                                                    \
        else                                                                                            \
            *overflow += 1;                                                                             \
    }                                                                                                   \
    TARGET static Scan name(const T *x, Py_ssize_t n, T m, T floor_, int64_t *counts, Py_ssize_t bins) { \
        name##_v lo, hi, mv, fv;                                                                        \
        name##_i nan = {0}, any = {0}, abs_mask;                                                        \
        for (int k = 0; k < name##_lanes; k++) {                                                        \
            lo[k] = INFINITY;                                                                           \
            hi[k] = -INFINITY;                                                                          \
            mv[k] = m;                                                                                  \
            fv[k] = floor_;                                                                             \
            abs_mask[k] = ABS_MASK;                                                                     \
        }                                                                                               \
        T limit = (T)(bins + 1); /* counted: trunc(s) <= bins */                                        \
        Py_ssize_t overflow = 0, i = 0;                                                                 \
        for (; i + BLOCK <= n; i += BLOCK) {                                                            \
            for (int k = 0; k < name##_lanes; k++)                                                      \
                any[k] = 0;                                                                             \
            for (int j = 0; j < BLOCK; j += name##_lanes) {                                             \
                name##_v v;                                                                             \
                memcpy(&v, x + i + j, sizeof v);                                                        \
                name##_i below = v < lo, above = v > hi; /* false for NaN: extremes skip it */          \
                lo = (name##_v)(((name##_i)v & below) | ((name##_i)lo & ~below));                       \
                hi = (name##_v)(((name##_i)v & above) | ((name##_i)hi & ~above));                       \
                nan |= v != v;                                                                          \
                any |= (name##_v)((name##_i)(v * mv) & abs_mask) >= fv;                                 \
            }                                                                                           \
            I hit = 0;                                                                                  \
            for (int k = 0; k < name##_lanes; k++)                                                      \
                hit |= any[k];                                                                          \
            if (!hit)                                                                                   \
                continue;                                                                               \
            uint64_t reach = 0; /* bit j: value i + j at or above the floor */                          \
            for (int j = 0; j < BLOCK; j += name##_lanes) {                                             \
                name##_v v;                                                                             \
                memcpy(&v, x + i + j, sizeof v);                                                        \
                name##_i ge = (name##_v)((name##_i)(v * mv) & abs_mask) >= fv;                          \
                for (int k = 0; k < name##_lanes; k++)                                                  \
                    reach |= (uint64_t)(ge[k] & 1) << (j + k);                                          \
            }                                                                                           \
            while (reach) { /* one loop over the block's set bits: one mispredicted exit */             \
                int j = __builtin_ctzll(reach);                                                         \
                reach &= reach - 1;                                                                     \
                name##_count((T)fabs((double)(x[i + j] * m)), limit, counts, &overflow);                \
            }                                                                                           \
        }                                                                                               \
        T l = INFINITY, h = -INFINITY;                                                                  \
        int nonfinite = 0;                                                                              \
        for (int k = 0; k < name##_lanes; k++) {                                                        \
            l = lo[k] < l ? lo[k] : l;                                                                  \
            h = hi[k] > h ? hi[k] : h;                                                                  \
            nonfinite |= nan[k] != 0;                                                                   \
        }                                                                                               \
        for (; i < n; i++) {                                                                            \
            T v = x[i];                                                                                 \
            l = v < l ? v : l;                                                                          \
            h = v > h ? v : h;                                                                          \
            nonfinite |= v != v;                                                                        \
            T s = (T)fabs((double)(v * m));                                                             \
            if (s >= floor_)                                                                            \
                name##_count(s, limit, counts, &overflow);                                              \
        }                                                                                               \
        Scan result = {l, h, nonfinite || isinf(l) || isinf(h), overflow};                              \
        return result;                                                                                  \
    }

SCAN_KERNEL(scan_float, float, int32_t, 0x7fffffff, 16, )
SCAN_KERNEL(scan_double, double, int64_t, 0x7fffffffffffffffLL, 16, )
#if HAVE_AVX2_BUILD
SCAN_KERNEL(scan_float_avx2, float, int32_t, 0x7fffffff, 32, __attribute__((target("avx2"))))
SCAN_KERNEL(scan_double_avx2, double, int64_t, 0x7fffffffffffffffLL, 32, __attribute__((target("avx2"))))
static int use_avx2 = 0; /* set when the module loads */
#endif

static int is_int64(const Py_buffer *b) {
    return b->itemsize == 8 && b->format && (strcmp(b->format, "l") == 0 || strcmp(b->format, "q") == 0);
}

static PyObject *scan(PyObject *self, PyObject *args) {
    PyObject *x_obj, *counts_obj;
    double multiplier, floor_;
    if (!PyArg_ParseTuple(args, "OddO", &x_obj, &multiplier, &floor_, &counts_obj))
        return NULL;
    Py_buffer x, counts;
    if (PyObject_GetBuffer(x_obj, &x, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    if (PyObject_GetBuffer(counts_obj, &counts, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&x);
        return NULL;
    }
    PyObject *result = NULL;
    int is_float = strcmp(x.format, "f") == 0, is_double = strcmp(x.format, "d") == 0;
    if (!is_float && !is_double) {
        PyErr_Format(PyExc_TypeError, "scan: x must hold float32 or float64 values, not format '%s'", x.format);
    } else if (!is_int64(&counts) || counts.len < 16) {
        PyErr_SetString(PyExc_TypeError, "scan: counts must be a writable int64 array of at least 2 items");
    } else {
        Py_ssize_t n = x.len / x.itemsize, bins = counts.len / 8 - 1; /* counts[bins]: |x| = top */
        Scan r;
        Py_BEGIN_ALLOW_THREADS;
        const float *xf = (const float *)x.buf;
        const double *xd = (const double *)x.buf;
        int64_t *c = (int64_t *)counts.buf;
#if HAVE_AVX2_BUILD
        if (use_avx2)
            r = is_float ? scan_float_avx2(xf, n, (float)multiplier, (float)floor_, c, bins)
                         : scan_double_avx2(xd, n, multiplier, floor_, c, bins);
        else
#endif
            r = is_float ? scan_float(xf, n, (float)multiplier, (float)floor_, c, bins)
                         : scan_double(xd, n, multiplier, floor_, c, bins);
        Py_END_ALLOW_THREADS;
        result = Py_BuildValue("ddNn", r.lo, r.hi, PyBool_FromLong(r.nonfinite), r.overflow);
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&counts);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(x, multiplier, floor, counts) -> (min, max, nonfinite, overflow); see the module's source."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "quantcore.observers._binning",
                                    "One-pass extremes and tail counts of a float batch (quantcore.observers.histogram).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__binning(void) {
#if HAVE_AVX2_BUILD
    __builtin_cpu_init();
    use_avx2 = __builtin_cpu_supports("avx2");
#endif
    return PyModule_Create(&module);
}
