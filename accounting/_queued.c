/* accounting/queued.py's QueuedPrompts, compiled: the same remembered prompts (in blocks, in
   order of first token), the same predecessor, the same chunks, with the same arithmetic on
   the same doubles (built with -ffp-contract=off; Python's float `%`, `round`, `min` and
   `max` written out as CPython computes them), so the same bills
   (tests/accounting/test_queued_compiled.py compares the two). The constants come from the
   Python module when it builds one: one source for both. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

typedef struct {
    double dispatched, first, last_start, tail;
} Seen;

typedef struct {
    Py_ssize_t n;
    Seen *at;  /* capacity 2 * block + 1 */
} Block;

typedef struct {
    Block *blocks;
    Py_ssize_t n, cap;
    double latest;
} Engine;

typedef struct {
    double chunk_tokens, min_chunk_step_s, queued_steps, memory_s, same_step_s, mismatch_steps;
    Py_ssize_t look_back, block;
} Consts;

typedef struct {
    PyObject_HEAD
    PyObject *engines;  /* engine name -> capsule of its Engine */
    Consts c;
} QueuedObject;

static const char *const NAMES[] = {
    "first_token_s", "dispatched_s", "engine", "prompt_tokens", "arrived_wall_s", "arrived_s",
    "step_from_s"};
enum {FIRST, DISPATCHED, ENGINE, PROMPT, ARRIVED_WALL, ARRIVED, STEP_FROM, N_NAMES};
static PyObject *interned[N_NAMES];
static const char CAPSULE[] = "wattgate.queued.engine";

static double py_min(double a, double b) { return b < a ? b : a; }
static double py_max(double a, double b) { return b > a ? b : a; }

/* float % float as CPython computes it */
static double py_mod(double vx, double wx) {
    double mod = fmod(vx, wx);
    if (mod != 0.0) {
        if ((wx < 0) != (mod < 0))
            mod += wx;
    } else {
        mod = copysign(0.0, wx);
    }
    return mod;
}

/* round(x) for a float, to an integral double (half to even, as CPython's round) */
static int py_round(double x, double *out) {
    if (isnan(x)) {
        PyErr_SetString(PyExc_ValueError, "cannot convert float NaN to integer");
        return -1;
    }
    if (isinf(x)) {
        PyErr_SetString(PyExc_OverflowError, "cannot convert float infinity to integer");
        return -1;
    }
    double r = round(x);
    if (fabs(x - r) == 0.5)
        r = 2.0 * round(x / 2.0);
    *out = r;
    return 0;
}

static double tail_of(const Consts *c, double tokens) {
    return py_mod(tokens - 1.0, c->chunk_tokens) + 1.0;
}

static void engine_free(PyObject *capsule) {
    Engine *e = PyCapsule_GetPointer(capsule, CAPSULE);
    if (e == NULL)
        return;
    for (Py_ssize_t k = 0; k < e->n; k++)
        PyMem_Free(e->blocks[k].at);
    PyMem_Free(e->blocks);
    PyMem_Free(e);
}

/* the first index whose value is > x (after <= x: bisect_right) */
static Py_ssize_t upper(const Block *b, double x) {
    Py_ssize_t lo = 0, hi = b->n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (x < b->at[mid].first)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* the first index whose value is >= x (bisect_left) */
static Py_ssize_t lower(const Block *b, double x) {
    Py_ssize_t lo = 0, hi = b->n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (b->at[mid].first < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static double block_max(const Engine *e, Py_ssize_t k) { return e->blocks[k].at[e->blocks[k].n - 1].first; }

/* the first block whose last first token is > x (bisect_right over the maxes) */
static Py_ssize_t upper_block(const Engine *e, double x) {
    Py_ssize_t lo = 0, hi = e->n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (x < block_max(e, mid))
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

static void forget(Engine *e, const Consts *c, double t_disp) {
    if (t_disp > e->latest)
        e->latest = t_disp;
    double edge = e->latest - c->memory_s;
    if (e->n == 0 || e->blocks[0].at[0].first >= edge)
        return;
    Py_ssize_t drop = 0;  /* bisect_left over the maxes */
    {
        Py_ssize_t lo = 0, hi = e->n;
        while (lo < hi) {
            Py_ssize_t mid = (lo + hi) / 2;
            if (block_max(e, mid) < edge)
                lo = mid + 1;
            else
                hi = mid;
        }
        drop = lo;
    }
    if (drop) {
        for (Py_ssize_t k = 0; k < drop; k++)
            PyMem_Free(e->blocks[k].at);
        memmove(e->blocks, e->blocks + drop, (size_t)(e->n - drop) * sizeof(Block));
        e->n -= drop;
    }
    if (e->n) {
        Block *b = &e->blocks[0];
        Py_ssize_t cut = lower(b, edge);
        memmove(b->at, b->at + cut, (size_t)(b->n - cut) * sizeof(Seen));
        b->n -= cut;
    }
}

static int add(Engine *e, const Consts *c, Seen s) {
    if (e->n == 0) {
        if (e->cap == 0) {
            e->blocks = PyMem_Malloc(4 * sizeof(Block));
            if (e->blocks == NULL)
                return -1;
            e->cap = 4;
        }
        Seen *at = PyMem_Malloc((size_t)(2 * c->block + 1) * sizeof(Seen));
        if (at == NULL)
            return -1;
        at[0] = s;
        e->blocks[0].at = at;
        e->blocks[0].n = 1;
        e->n = 1;
        return 0;
    }
    Py_ssize_t k = upper_block(e, s.first);
    if (k == e->n)
        k -= 1;
    Seen *fresh = NULL;  /* the split's new block, taken before anything moves */
    if (e->blocks[k].n == 2 * c->block) {
        if (e->n == e->cap) {
            Block *more = PyMem_Realloc(e->blocks, (size_t)(2 * e->cap) * sizeof(Block));
            if (more == NULL)
                return -1;
            e->blocks = more;
            e->cap *= 2;
        }
        fresh = PyMem_Malloc((size_t)(2 * c->block + 1) * sizeof(Seen));
        if (fresh == NULL)
            return -1;
    }
    Block *b = &e->blocks[k];
    Py_ssize_t i = upper(b, s.first);
    memmove(b->at + i + 1, b->at + i, (size_t)(b->n - i) * sizeof(Seen));
    b->at[i] = s;
    b->n += 1;
    if (fresh != NULL) {
        Py_ssize_t moved = b->n - c->block;
        memcpy(fresh, b->at + c->block, (size_t)moved * sizeof(Seen));
        b->n = c->block;
        memmove(e->blocks + k + 2, e->blocks + k + 1, (size_t)(e->n - k - 1) * sizeof(Block));
        e->blocks[k + 1].at = fresh;
        e->blocks[k + 1].n = moved;
        e->n += 1;
    }
    return 0;
}

/* the prompt read just before one dispatched at t_disp (NULL: none) */
static const Seen *predecessor(const Engine *e, const Consts *c, double t_disp, double t_first) {
    if (e->n == 0)
        return NULL;
    Py_ssize_t k = upper_block(e, t_first), i;
    if (k == e->n) {
        k -= 1;
        i = e->blocks[k].n;
    } else {
        i = upper(&e->blocks[k], t_first);
    }
    for (Py_ssize_t step = 0; step < c->look_back; step++) {
        if (i == 0) {
            if (k == 0)
                return NULL;
            k -= 1;
            i = e->blocks[k].n;
        }
        i -= 1;
        const Seen *s = &e->blocks[k].at[i];
        if (s->first <= t_disp)
            return NULL;
        if (s->dispatched < t_disp)
            return s;
    }
    return NULL;
}

/* chunks: a list of (tokens, start, end); append one */
static int chunk(PyObject *out, double tokens, double start, double end) {
    PyObject *t = Py_BuildValue("(ddd)", tokens, start, end);
    if (t == NULL)
        return -1;
    int r = PyList_Append(out, t);
    Py_DECREF(t);
    return r;
}

/* queued.py _first: NULL with no error where there are none */
static PyObject *first_chunks(const Consts *c, double prompt, double t_disp, double last_start,
                              double t_first, double step_s) {
    double tail = tail_of(c, prompt), whole;
    if (py_round((prompt - tail) / c->chunk_tokens, &whole) < 0)
        return NULL;
    if (whole == 0.0 || !((last_start - t_disp) / step_s >= whole - c->mismatch_steps))
        return NULL;
    double start = py_max(t_disp, last_start - whole * step_s);
    double each = (last_start - start) / whole;
    double per = (prompt - tail) / whole;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t s = 0; s < (Py_ssize_t)whole; s++)
        if (chunk(out, per, start + (double)s * each, start + (double)(s + 1) * each) < 0)
            goto fail;
    if (chunk(out, tail, last_start, t_first) < 0)
        goto fail;
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* queued.py _chain: *chunks NULL where there are none; -1 on an error */
static int chain(const Consts *c, const Seen *pred, double prompt, double t_disp,
                 double last_start, double t_first, double step_s, int sure,
                 PyObject **chunks, double *tail_out) {
    double head;
    int has_first;
    *chunks = NULL;
    if (t_disp > pred->last_start) {
        head = py_min(prompt, c->chunk_tokens);
        has_first = 0;
    } else {
        head = py_min(prompt, py_max(0.0, c->chunk_tokens - pred->tail));
        has_first = head > 0.0;
    }
    double rest = prompt - head;
    if (rest <= 0.0 || (sure && last_start < pred->first - c->same_step_s)) {
        *tail_out = tail_of(c, prompt);
        return 0;
    }
    double tail = tail_of(c, rest);
    *tail_out = tail;
    double in_whole = prompt - tail - (has_first ? head : 0.0), whole;
    if (py_round(in_whole / c->chunk_tokens, &whole) < 0)
        return -1;
    if (!sure)
        last_start = py_min(t_first, pred->first + whole * step_s);
    if (last_start < pred->first)
        last_start = pred->first;
    if (!(fabs((last_start - pred->first) / step_s - whole) <= c->mismatch_steps))
        return 0;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return -1;
    if (has_first && chunk(out, head, pred->last_start, pred->first) < 0)
        goto fail;
    if (whole != 0.0) {
        double each = (last_start - pred->first) / whole;
        double per = in_whole / whole;
        for (Py_ssize_t s = 0; s < (Py_ssize_t)whole; s++)
            if (chunk(out, per, pred->first + (double)s * each,
                      pred->first + (double)(s + 1) * each) < 0)
                goto fail;
    }
    if (chunk(out, tail, last_start, t_first) < 0)
        goto fail;
    *chunks = out;
    return 0;
fail:
    Py_DECREF(out);
    return -1;
}

/* a field as a double; 1 where it is None, -1 on an error */
static int field(PyObject *rec, int name, double *out) {
    PyObject *v = PyObject_GetAttr(rec, interned[name]);
    if (v == NULL)
        return -1;
    if (v == Py_None) {
        Py_DECREF(v);
        return 1;
    }
    *out = PyFloat_AsDouble(v);
    Py_DECREF(v);
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

static Engine *engine_of(QueuedObject *self, PyObject *name) {
    PyObject *cap = PyDict_GetItemWithError(self->engines, name);
    if (cap != NULL)
        return PyCapsule_GetPointer(cap, CAPSULE);
    if (PyErr_Occurred())
        return NULL;
    Engine *e = PyMem_Calloc(1, sizeof(Engine));
    if (e == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    e->latest = -INFINITY;
    cap = PyCapsule_New(e, CAPSULE, engine_free);
    if (cap == NULL) {
        PyMem_Free(e);
        return NULL;
    }
    int r = PyDict_SetItem(self->engines, name, cap);
    Py_DECREF(cap);
    return r < 0 ? NULL : e;
}

static PyObject *place(QueuedObject *self, PyObject *args) {
    PyObject *rec, *engine_name = NULL, *prompt_obj = NULL, *chunks = NULL;
    double rate, t_first, t_disp, wall, arrived, step_from, prompt;
    if (!PyArg_ParseTuple(args, "Od", &rec, &rate))
        return NULL;
    if (self->engines == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "QueuedPrompts was not initialised");
        return NULL;
    }
    const Consts *c = &self->c;
    int got;
    if ((got = field(rec, FIRST, &t_first)) != 0 || (got = field(rec, DISPATCHED, &t_disp)) != 0)
        goto none_or_error;
    engine_name = PyObject_GetAttr(rec, interned[ENGINE]);
    if (engine_name == NULL)
        return NULL;
    if ((got = PyObject_IsTrue(engine_name)) <= 0)
        goto none_or_error;
    prompt_obj = PyObject_GetAttr(rec, interned[PROMPT]);
    if (prompt_obj == NULL)
        goto error;
    if ((got = PyObject_IsTrue(prompt_obj)) <= 0)
        goto none_or_error;
    if ((prompt = PyFloat_AsDouble(prompt_obj)) == -1.0 && PyErr_Occurred())
        goto error;
    if (field(rec, ARRIVED_WALL, &wall) != 0 || field(rec, ARRIVED, &arrived) != 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "a record's arrival times are not numbers");
        goto error;
    }
    int has_step = 0;
    if ((got = field(rec, STEP_FROM, &step_from)) < 0)
        goto error;
    has_step = got == 0;
    double off = wall - arrived;
    double raw_first = t_first, raw_disp = t_disp;
    t_disp += off;
    t_first += off;
    Engine *e = engine_of(self, engine_name);
    if (e == NULL)
        goto error;
    forget(e, c, t_disp);
    const Seen *pred_at = predecessor(e, c, t_disp, t_first);
    Seen pred = {0.0, 0.0, 0.0, 0.0};
    if (pred_at != NULL)
        pred = *pred_at;  /* the add below may move it */
    double step_s = rate > 0.0 ? c->chunk_tokens / rate : 0.0;
    double last_start = t_first - step_s, tail;
    int sure = 0;
    if (has_step && t_first - (step_from + off) >= c->min_chunk_step_s) {
        last_start = step_from + off;
        sure = 1;
    }
    if (pred_at == NULL) {
        tail = tail_of(c, prompt);
        if (sure && step_s > 0.0) {
            chunks = first_chunks(c, prompt, t_disp, last_start, t_first, step_s);
            if (chunks == NULL && PyErr_Occurred())
                goto error;
        }
    } else if (t_first - pred.first < c->same_step_s) {
        last_start = pred.last_start;
        tail = pred.tail + prompt;
    } else if (has_step && step_s > 0.0) {
        if (chain(c, &pred, prompt, t_disp, last_start, t_first, step_s, sure, &chunks,
                  &tail) < 0)
            goto error;
        if (chunks != NULL) {
            PyObject *lastc = PyList_GET_ITEM(chunks, PyList_GET_SIZE(chunks) - 1);
            last_start = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(lastc, 1));
        }
    } else {
        tail = tail_of(c, prompt);
    }
    Seen s = {t_disp, t_first, last_start, tail};
    if (add(e, c, s) < 0) {
        PyErr_NoMemory();
        goto error;
    }
    Py_DECREF(engine_name);
    Py_DECREF(prompt_obj);
    /* queued_behind(rec, rate) */
    if (chunks != NULL && !(rate <= 0.0 || prompt <= c->chunk_tokens || !has_step
                            || !(raw_first - raw_disp
                                 > (prompt + c->queued_steps * c->chunk_tokens) / rate))) {
        return chunks;
    }
    Py_XDECREF(chunks);
    Py_RETURN_NONE;
none_or_error:
    Py_XDECREF(engine_name);
    Py_XDECREF(prompt_obj);
    if (got < 0)
        return NULL;
    Py_RETURN_NONE;
error:
    Py_XDECREF(engine_name);
    Py_XDECREF(prompt_obj);
    Py_XDECREF(chunks);
    return NULL;
}

static int queued_init(QueuedObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"chunk_tokens", "min_chunk_step_s", "queued_steps", "memory_s",
                             "same_step_s", "mismatch_steps", "look_back", "block", NULL};
    Consts c;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "ddddddnn", kwlist, &c.chunk_tokens,
                                     &c.min_chunk_step_s, &c.queued_steps, &c.memory_s,
                                     &c.same_step_s, &c.mismatch_steps, &c.look_back, &c.block))
        return -1;
    if (c.block < 1 || c.block > (PY_SSIZE_T_MAX / (Py_ssize_t)sizeof(Seen) - 1) / 2
        || c.look_back < 0 || !(c.chunk_tokens > 0.0)) {
        PyErr_SetString(PyExc_ValueError,
                        "block between 1 and what memory can hold, look_back >= 0, "
                        "chunk_tokens > 0");
        return -1;
    }
    self->c = c;
    PyObject *engines = PyDict_New();
    if (engines == NULL)
        return -1;
    Py_XSETREF(self->engines, engines);
    return 0;
}

static void queued_dealloc(QueuedObject *self) {
    Py_XDECREF(self->engines);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef queued_methods[] = {
    {"place", (PyCFunction)place, METH_VARARGS,
     "place(rec, rate) -> chunks or None, as accounting.queued.QueuedPrompts.place"},
    {NULL, NULL, 0, NULL}};

static PyTypeObject QueuedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "accounting._queued.QueuedPrompts",
    .tp_basicsize = sizeof(QueuedObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Per engine, the recent prompts' last steps (accounting/queued.py), compiled.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)queued_init,
    .tp_dealloc = (destructor)queued_dealloc,
    .tp_methods = queued_methods,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "accounting._queued", NULL, -1,
                                    NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__queued(void) {
    for (int i = 0; i < N_NAMES; i++)
        if ((interned[i] = PyUnicode_InternFromString(NAMES[i])) == NULL)
            return NULL;
    if (PyType_Ready(&QueuedType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&QueuedType);
    if (PyModule_AddObject(m, "QueuedPrompts", (PyObject *)&QueuedType) < 0) {
        Py_DECREF(&QueuedType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
