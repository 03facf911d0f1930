/* One pass over a logits row for localchat's sampler (localchat/backends/llamacpp_sampler.py): the best
   logit's token and the tokens near it (within a span of it, or the k best), written straight into the
   array of candidates that llama.cpp's sampler chain reads.

   Why C: right after a decode each numpy call waits for its code and data, and the search in numpy (an
   argmax, a comparison, nonzero, a partition for top-k, two writes of the candidates) took most of a pick.
   Timed inside a reply with each model's default chain (AMD EPYC with AVX2, 2 cores), a pick took 0.27
   against 0.51 ms on Gemma 3 270M's 262k vocabulary and 0.17 against 0.31 on SmolLM2's 49k; reading a
   262k row once, as the argmax does, costs 0.11-0.15 ms there. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>

#if defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>
#define HAVE_SSE2 1
#endif

/* Logits are scanned in blocks of this many: a first pass keeps each block's maximum, and the second
   reads again only the blocks whose maximum is within the span of the best. */
#define BLOCK 64

/* llama.cpp's llama_token_data. */
typedef struct {
    int32_t id;
    float logit;
    float p;
} token_data;

/* The largest of BLOCK logits, NaNs left out (-inf if all are NaN): maxps returns its second operand
   when either is NaN, so the logits go first and the running maxima second. */
static float block_max(const float *x)
{
#ifdef HAVE_SSE2
    __m128 a = _mm_set1_ps(-INFINITY), b = a, c = a, d = a;
    for (int i = 0; i < BLOCK; i += 16) {
        a = _mm_max_ps(_mm_loadu_ps(x + i), a);
        b = _mm_max_ps(_mm_loadu_ps(x + i + 4), b);
        c = _mm_max_ps(_mm_loadu_ps(x + i + 8), c);
        d = _mm_max_ps(_mm_loadu_ps(x + i + 12), d);
    }
    a = _mm_max_ps(_mm_max_ps(a, b), _mm_max_ps(c, d));
    a = _mm_max_ps(a, _mm_shuffle_ps(a, a, _MM_SHUFFLE(1, 0, 3, 2)));
    a = _mm_max_ps(a, _mm_shuffle_ps(a, a, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtss_f32(a);
#else
    float m = -INFINITY;
    for (int i = 0; i < BLOCK; i++)
        m = x[i] > m ? x[i] : m;
    return m;
#endif
}

/* The `rank`-th largest (1-based) of values[0:n], none NaN, reordering them (Hoare's quickselect). */
static float select_rank(float *values, Py_ssize_t n, Py_ssize_t rank)
{
    Py_ssize_t lo = 0, hi = n - 1, target = rank - 1;
    while (lo < hi) {
        float a = values[lo], b = values[lo + (hi - lo) / 2], c = values[hi];
        float pivot = a > b ? (b > c ? b : (a > c ? c : a)) : (a > c ? a : (b > c ? c : b));  /* median of three */
        Py_ssize_t i = lo, j = hi;
        while (i <= j) {  /* descending: the larger values first */
            while (values[i] > pivot)
                i++;
            while (values[j] < pivot)
                j--;
            if (i <= j) {
                float t = values[i];
                values[i++] = values[j];
                values[j--] = t;
            }
        }
        if (target <= j)
            hi = j;
        else if (target >= i)
            lo = i;
        else
            return values[target];
    }
    return values[target];
}

/* Appends the tokens of row[start:end] at least `floor` to `out`; the first equal to `best` is the argmax. */
static Py_ssize_t take(const float *row, Py_ssize_t start, Py_ssize_t end, float floor, float best,
                       token_data *out, Py_ssize_t count, Py_ssize_t *best_id)
{
    for (Py_ssize_t j = start; j < end; j++) {
        float v = row[j];
        if (v >= floor) {
            out[count].id = (int32_t)j;
            out[count].logit = v;
            out[count].p = 0.0f;
            count++;
            if (*best_id < 0 && v == best)
                *best_id = j;
        }
    }
    return count;
}

/* Whether a buffer holds native float32s: format "f", with a byte-order mark that names this machine's
   (numpy's view of a ctypes pointer says "<f"). */
static int native_float32(const Py_buffer *view)
{
    const char *format = view->format;
    if (view->itemsize != 4 || format == NULL)
        return 0;
    if (*format == '@' || *format == '=' || *format == (PY_LITTLE_ENDIAN ? '<' : '>'))
        format++;
    return strcmp(format, "f") == 0;
}

/* The scan, on buffers already checked; -1 (an exception set) if out of memory. */
static Py_ssize_t scan(const float *row, Py_ssize_t n, float span, Py_ssize_t least, token_data *out,
                       Py_ssize_t *best_id, float *floor_out)
{
    /* Each block's maximum, and then each logit past the last whole block as a block of its own. */
    Py_ssize_t blocks = n / BLOCK, tail = blocks * BLOCK, n_maxima = blocks + (n - tail);
    float *maxima = PyMem_Malloc(sizeof(float) * (size_t)(2 * n_maxima + 1));
    if (maxima == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    float best = -INFINITY;
    for (Py_ssize_t b = 0; b < blocks; b++) {
        float m = block_max(row + b * BLOCK);
        maxima[b] = m;
        best = m > best ? m : best;
    }
    for (Py_ssize_t j = tail; j < n; j++) {
        float v = row[j] == row[j] ? row[j] : -INFINITY;  /* NaN: never taken */
        maxima[blocks + j - tail] = v;
        best = v > best ? v : best;
    }
    float floor = best - span;
    if (least > 0 && least <= n_maxima) {
        /* `least` blocks reach the least-th largest maximum, so at least `least` logits do too. */
        float *copy = maxima + n_maxima;
        memcpy(copy, maxima, sizeof(float) * (size_t)n_maxima);
        float reached = select_rank(copy, n_maxima, least);
        floor = reached > floor ? reached : floor;
    }
    Py_ssize_t count = 0;
    *best_id = -1;
    for (Py_ssize_t b = 0; b < blocks; b++)
        if (maxima[b] >= floor)
            count = take(row, b * BLOCK, (b + 1) * BLOCK, floor, best, out, count, best_id);
    count = take(row, tail, n, floor, best, out, count, best_id);
    PyMem_Free(maxima);

    if (least > 0 && count > least) {
        /* Up to the least-th largest logit exactly. */
        float *logits = PyMem_Malloc(sizeof(float) * (size_t)count);
        if (logits == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t c = 0; c < count; c++)
            logits[c] = out[c].logit;
        float reached = select_rank(logits, count, least);
        PyMem_Free(logits);
        if (reached > floor) {
            floor = reached;
            Py_ssize_t kept = 0;
            for (Py_ssize_t c = 0; c < count; c++)
                if (out[c].logit >= floor)
                    out[kept++] = out[c];
            count = kept;
        }
    }
    if (*best_id < 0)
        *best_id = 0;
    *floor_out = floor;
    return count;
}

PyDoc_STRVAR(near_best_doc,
"near_best(row, span, least, out) -> (count, best_id, floor)\n\n"
"The tokens whose logit in `row` (float32, contiguous) is at least `floor`: the best logit less `span`,\n"
"or, if higher and `least` > 0, the least-th largest logit (so that at least `least` are taken, ties\n"
"and all, unless fewer lie within the span). They are written in ascending order as llama_token_data\n"
"(int32 id, float logit, float p = 0) to the start of `out`, a writable buffer of at least len(row) of\n"
"them. Returns their count, the best logit's token (the lowest of equals, as numpy's argmax) and the\n"
"floor, a float32. NaN logits are never taken.");

static PyObject *near_best(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "near_best takes a row, a span, a least count and an output buffer");
        return NULL;
    }
    double span = PyFloat_AsDouble(args[1]);
    if (span == -1.0 && PyErr_Occurred())
        return NULL;
    Py_ssize_t least = PyNumber_AsSsize_t(args[2], PyExc_OverflowError);
    if (least == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer row_view, out_view;
    if (PyObject_GetBuffer(args[0], &row_view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    if (!native_float32(&row_view)) {
        PyBuffer_Release(&row_view);
        PyErr_SetString(PyExc_TypeError, "near_best's row must hold float32 logits");
        return NULL;
    }
    if (PyObject_GetBuffer(args[3], &out_view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&row_view);
        return NULL;
    }
    Py_ssize_t n = row_view.len / 4, best_id = 0;
    float floor = 0.0f;
    Py_ssize_t count;
    if (out_view.len < n * (Py_ssize_t)sizeof(token_data)) {
        PyErr_SetString(PyExc_ValueError, "near_best's output buffer holds fewer candidates than the row has logits");
        count = -1;
    } else {
        count = scan((const float *)row_view.buf, n, (float)span, least, (token_data *)out_view.buf, &best_id, &floor);
    }
    PyBuffer_Release(&row_view);
    PyBuffer_Release(&out_view);
    if (count < 0)
        return NULL;
    return Py_BuildValue("(nnd)", count, best_id, (double)floor);
}

static PyMethodDef methods[] = {
    {"near_best", (PyCFunction)(void (*)(void))near_best, METH_FASTCALL, near_best_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "localchat.backends._logits_scan",
    .m_doc = "A logits row's best token and the tokens near it, in one pass (see near_best).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__logits_scan(void)
{
    return PyModule_Create(&module);
}
