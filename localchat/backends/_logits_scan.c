/* One pass over a logits row for localchat's sampler (localchat/backends/llamacpp_sampler.py): the best
   logit's token and the tokens near it (within a span of it, or the k best), written straight into the
   array of candidates that llama.cpp's sampler chain reads; and the draw, the chain run over them.

   Why C: right after a decode each numpy call waits for its code and data, and the search in numpy (an
   argmax, a comparison, nonzero, a partition for top-k, two writes of the candidates) took most of a pick.
   Timed inside a reply with each model's default chain (AMD EPYC with AVX2, 2 cores), a pick took 0.27
   against 0.51 ms on Gemma 3 270M's 262k vocabulary and 0.17 against 0.31 on SmolLM2's 49k; reading a
   262k row once, as the argmax does, costs 0.11-0.15 ms there.

   Why one pass with a running floor: the first version kept each 64-logit block's maximum, ranked all of
   them to find the k best's floor, and read the blocks above it again. In a reply the search for top-k's
   candidates took 0.12-0.13 ms against its 0.15-0.16 (Gemma; an argmax 0.11) and 0.039-0.049 against
   0.047-0.057 (SmolLM2), the two alternating on the same machine. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#if defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>
#define HAVE_SSE2 1
#endif

/* Logits are compared with the running floor this many at a time; a group none of which reaches it is
   passed over without a branch per logit. */
#define GROUP 32

/* llama.cpp's llama_token_data. */
typedef struct {
    int32_t id;
    float logit;
    float p;
} token_data;

/* Which of x[0:GROUP] are at least `floor`, a bit each (NaNs never are); most groups have none, which
   one test tells. */
static uint32_t reaching(const float *x, float floor)
{
#ifdef HAVE_SSE2
    __m128 f = _mm_set1_ps(floor), any = _mm_setzero_ps();
    for (int i = 0; i < GROUP; i += 4)
        any = _mm_or_ps(any, _mm_cmpge_ps(_mm_loadu_ps(x + i), f));
    if (!_mm_movemask_ps(any))
        return 0;
    uint32_t bits = 0;
    for (int i = 0; i < GROUP; i += 4)
        bits |= (uint32_t)_mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(x + i), f)) << i;
    return bits;
#else
    uint32_t bits = 0;
    for (int i = 0; i < GROUP; i++)
        bits |= (uint32_t)(x[i] >= floor) << i;
    return bits;
#endif
}

/* The largest of x[0:GROUP], NaNs left out (-inf if all are NaN): maxps returns its second operand when
   either is NaN, so the logits go first and the running maxima second. */
static float group_max(const float *x)
{
#ifdef HAVE_SSE2
    __m128 a = _mm_set1_ps(-INFINITY), b = a;
    for (int i = 0; i < GROUP; i += 8) {
        a = _mm_max_ps(_mm_loadu_ps(x + i), a);
        b = _mm_max_ps(_mm_loadu_ps(x + i + 4), b);
    }
    a = _mm_max_ps(a, b);
    a = _mm_max_ps(a, _mm_shuffle_ps(a, a, _MM_SHUFFLE(1, 0, 3, 2)));
    a = _mm_max_ps(a, _mm_shuffle_ps(a, a, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtss_f32(a);
#else
    float m = -INFINITY;
    for (int i = 0; i < GROUP; i++)
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

/* Keeps the candidates of out[0:count] at least `floor`, in their order; returns how many. */
static Py_ssize_t keep_from(token_data *out, Py_ssize_t count, float floor)
{
    Py_ssize_t kept = 0;
    for (Py_ssize_t c = 0; c < count; c++)
        if (out[c].logit >= floor)
            out[kept++] = out[c];
    return kept;
}

/* The rank-th largest logit of out[0:count] (rank <= count), selected in `scratch` (room for count). */
static float rank_of(const token_data *out, Py_ssize_t count, Py_ssize_t rank, float *scratch)
{
    for (Py_ssize_t c = 0; c < count; c++)
        scratch[c] = out[c].logit;
    return select_rank(scratch, count, rank);
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

/* Groups of the row's start whose maxima give a first floor (see scan), per logit asked for. */
#define SEED_GROUPS 4

/* The search: the row is read once, and each logit at least the running floor (a bound under the final
   one: the best so far less the span, or the least-th largest of those kept so far) is appended to `out`;
   once `out` holds twice `least`, those under the least-th largest go and the floor rises to it. After the
   first few thousand logits hardly any reaches it, and a group of them costs one comparison. Returns the
   count, or -1 (an exception set) if out of memory. */
static Py_ssize_t scan(const float *row, Py_ssize_t n, float span, Py_ssize_t least, token_data *out,
                       Py_ssize_t *best_id, float *floor_out)
{
    Py_ssize_t groups_end = n - n % GROUP;
    Py_ssize_t seeds = least > 0 && groups_end >= SEED_GROUPS * least * GROUP ? SEED_GROUPS * least : 0;
    /* How many candidates `out` holds before it is cut back to the `least` best, and the room in `scratch`,
       where they are ranked. */
    Py_ssize_t room = least > 0 && 2 * least < n ? 2 * least : n;
    Py_ssize_t held = least > 0 ? (room > seeds ? room : seeds) : 0;
    float *scratch = held > 0 ? PyMem_Malloc(sizeof(float) * (size_t)held) : NULL;
    if (held > 0 && scratch == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    float best = -INFINITY, floor = -INFINITY;
    if (seeds > 0) {
        /* `least` of the first groups reach the least-th largest of their maxima, so at least `least` logits do. */
        for (Py_ssize_t g = 0; g < seeds; g++)
            scratch[g] = group_max(row + g * GROUP);
        floor = select_rank(scratch, seeds, least);
    }
    Py_ssize_t count = 0;
    *best_id = -1;
    for (Py_ssize_t start = 0; start < n; start += GROUP) {
        /* The logits of this group at least the floor (all of a last group short of GROUP, NaNs aside). */
        uint32_t bits = start < groups_end ? reaching(row + start, floor) : (UINT32_C(1) << (n - start)) - 1;
        for (; bits != 0; bits &= bits - 1) {
            Py_ssize_t j = start + __builtin_ctz(bits);
            float v = row[j];
            if (!(v >= floor))  /* NaN, or under a floor risen since: never taken */
                continue;
            if (v > best) {  /* the first of equals stays the best, as numpy's argmax */
                best = v;
                *best_id = j;
                floor = best - span > floor ? best - span : floor;
            }
            out[count].id = (int32_t)j;
            out[count].logit = v;
            out[count].p = 0.0f;
            if (++count < room || least == 0 || count == n)
                continue;
            float reached = rank_of(out, count, least, scratch);
            floor = reached > floor ? reached : floor;
            count = keep_from(out, count, floor);
            if (count > room / 2) {  /* ties at the floor: more room */
                room = 2 * room < n ? 2 * room : n;
                if (room > held) {
                    float *larger = PyMem_Realloc(scratch, sizeof(float) * (size_t)room);
                    if (larger == NULL) {
                        PyMem_Free(scratch);
                        PyErr_NoMemory();
                        return -1;
                    }
                    scratch = larger;
                    held = room;
                }
            }
        }
    }
    /* The logits kept before the best came are held to its span now. */
    floor = best - span;
    count = keep_from(out, count, floor);
    if (least > 0 && count >= least) {
        /* Up to the least-th largest logit exactly. */
        float reached = rank_of(out, count, least, scratch);
        if (reached > floor) {
            floor = reached;
            count = keep_from(out, count, floor);
        }
    }
    PyMem_Free(scratch);
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

/* llama.cpp's llama_token_data_array, and the two calls of its sampler API that a draw makes. */
typedef struct {
    token_data *data;
    size_t size;
    int64_t selected;
    bool sorted;
} token_data_array;
typedef void (*sampler_apply)(void *chain, token_data_array *candidates);
typedef void (*sampler_accept)(void *chain, int32_t token);

PyDoc_STRVAR(draw_doc,
"draw(candidates, count, chain, apply, accept) -> token\n\n"
"llama.cpp's sampler `chain` (an address) run over the first `count` llama_token_data of `candidates` (a\n"
"writable buffer; the chain may reorder them), and told the token it picked: `apply` and `accept` are the\n"
"addresses of llama_sampler_apply and llama_sampler_accept. One call where ctypes takes six: after a decode\n"
"each of those waits for its code and data.");

static PyObject *draw(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "draw takes candidates, a count, a chain and the apply and accept functions");
        return NULL;
    }
    Py_ssize_t count = PyNumber_AsSsize_t(args[1], PyExc_OverflowError);
    if (count == -1 && PyErr_Occurred())
        return NULL;
    void *chain = PyLong_AsVoidPtr(args[2]);
    sampler_apply apply = (sampler_apply)PyLong_AsVoidPtr(args[3]);
    sampler_accept accept = (sampler_accept)PyLong_AsVoidPtr(args[4]);
    if (PyErr_Occurred())
        return NULL;
    if (chain == NULL || apply == NULL || accept == NULL) {
        PyErr_SetString(PyExc_ValueError, "draw needs a chain and llama.cpp's apply and accept");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        return NULL;
    if (count <= 0 || view.len < count * (Py_ssize_t)sizeof(token_data)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "draw needs at least one candidate, and no more than its buffer holds");
        return NULL;
    }
    token_data_array array = {(token_data *)view.buf, (size_t)count, -1, false};
    apply(chain, &array);
    int32_t token = array.selected >= 0 && (size_t)array.selected < array.size ? array.data[array.selected].id : -1;
    if (token >= 0)
        accept(chain, token);
    PyBuffer_Release(&view);
    if (token < 0) {
        PyErr_SetString(PyExc_RuntimeError, "llama.cpp's sampler chain selected no candidate");
        return NULL;
    }
    return PyLong_FromLong(token);
}

static PyMethodDef methods[] = {
    {"near_best", (PyCFunction)(void (*)(void))near_best, METH_FASTCALL, near_best_doc},
    {"draw", (PyCFunction)(void (*)(void))draw, METH_FASTCALL, draw_doc},
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
