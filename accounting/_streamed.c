/* accounting/work.py's _streamed_rows loop and accounting/heads.py's with_heads, compiled:
   the same rows, bit for bit.

   A stream's work rows, one per interval of its residency, were most of the accounting
   child's CPU per record spent in Python (one bisection, a dozen float operations and a
   tuple per interval; then a pass over the rows for their heads). Every operation below is
   the one the Python performs, in its order, on IEEE doubles (built with -ffp-contract=off:
   no fused multiply-add, which would round differently), so the rows are equal to the
   Python loops'; tests/accounting/test_streamed_compiled.py compares them on random
   records. work.py and heads.py fall back to their Python loops where this module was not
   built. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* bisect.bisect_left over a tuple of floats */
static Py_ssize_t bisect_left(PyObject *times, double x, int *failed) {
    Py_ssize_t lo = 0, hi = PyTuple_GET_SIZE(times);
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        double t = PyFloat_AsDouble(PyTuple_GET_ITEM(times, mid));
        if (t == -1.0 && PyErr_Occurred()) {
            *failed = 1;
            return 0;
        }
        if (t < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* A row holds a str, an int and floats, none of which refers to anything: it can be in no
   reference cycle, so the garbage collector need not walk it (CPython untracks such a tuple
   itself, but only once a collection has walked it). A flush's rows live until they are
   written, and walking them in every collection meanwhile cost the child more than building
   them. */
static void untrack(PyObject *row) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(row); i++)
        if (PyObject_GC_IsTracked(PyTuple_GET_ITEM(row, i)))
            return;
    PyObject_GC_UnTrack(row);
}

static int append_row(PyObject *rows, PyObject *rid, PyObject *k_obj, double p, double d,
                      double res, double start, double kv, double pf) {
    double values[6] = {p, d, res, start, kv, pf};
    PyObject *row = PyTuple_New(8);
    if (row == NULL)
        return -1;
    Py_INCREF(rid);
    PyTuple_SET_ITEM(row, 0, rid);
    Py_INCREF(k_obj);
    PyTuple_SET_ITEM(row, 1, k_obj);
    for (int i = 0; i < 6; i++) {
        PyObject *v = PyFloat_FromDouble(values[i]);
        if (v == NULL) {
            Py_DECREF(row);
            return -1;
        }
        PyTuple_SET_ITEM(row, 2 + i, v);
    }
    untrack(row);
    int rc = PyList_Append(rows, row);
    Py_DECREF(row);
    return rc;
}

/* dict.get(k, 0.0) of a {interval: float} dict; -1 with an error set on failure */
static int get_float(PyObject *dict, PyObject *k_obj, double *out, int *found) {
    PyObject *v = PyDict_GET_SIZE(dict) ? PyDict_GetItemWithError(dict, k_obj) : NULL;
    if (v == NULL) {
        if (PyErr_Occurred())
            return -1;
        *out = 0.0;
        *found = 0;
        return 0;
    }
    *out = PyFloat_AsDouble(v);
    *found = 1;
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

static PyObject *streamed_rows(PyObject *self, PyObject *args) {
    PyObject *rid, *times, *cum, *prefill, *attention;
    long long total, completion, k_first, k_last, k_r0, k_rl;
    double off, prompt, t_disp, t_end, t_pf, interval_s, first;
    int span;
    if (!PyArg_ParseTuple(args, "UO!OLdLdO!O!dddLLdpLLd", &rid, &PyTuple_Type, &times, &cum,
                          &total, &off, &completion, &prompt, &PyDict_Type, &prefill,
                          &PyDict_Type, &attention, &t_disp, &t_end, &t_pf, &k_first, &k_last,
                          &interval_s, &span, &k_r0, &k_rl, &first))
        return NULL;
    if (cum != Py_None && !PyList_Check(cum)) {
        PyErr_SetString(PyExc_TypeError, "cum: a list or None");
        return NULL;
    }
    /* completion / total: both exact in a double (at most 2**53), one rounding as Python's */
    double per_event = (double)completion / (double)total;
    PyObject *rows = PyList_New(0);
    if (rows == NULL)
        return NULL;
    double done = 0.0;
    long long prev = 0;
    for (long long k = k_first; k <= k_last; k++) {
        double lo = (double)k * interval_s;
        double hi = lo + interval_s;
        long long c;
        if (k >= k_rl) {
            c = total;
        } else if (k < k_r0) {
            c = 0;
        } else {
            int failed = 0;
            double edge = (span ? (double)(k + 1) * interval_s : hi) - off;
            Py_ssize_t i = bisect_left(times, edge, &failed);
            if (failed)
                goto error;
            if (cum == Py_None) {
                c = i;
            } else if (i == 0) {
                c = 0;
            } else {
                c = PyLong_AsLongLong(PyList_GET_ITEM(cum, i - 1));
                if (c == -1 && PyErr_Occurred())
                    goto error;
            }
        }
        double start = t_disp > lo ? t_disp : lo;
        double res = (t_end < hi ? t_end : hi) - start;
        double pf = (t_pf < hi ? t_pf : hi) - start;
        pf = pf > 0.0 ? pf : 0.0;
        PyObject *k_obj = PyLong_FromLongLong(k);
        if (k_obj == NULL)
            goto error;
        double p, a;
        int has_p, has_a, rc = 0;
        if (get_float(prefill, k_obj, &p, &has_p) < 0 || get_float(attention, k_obj, &a, &has_a) < 0) {
            Py_DECREF(k_obj);
            goto error;
        }
        if (c > prev) {
            double d = (double)(c - prev) * per_event;
            if (prev == 0)
                d = d - (first < d ? first : d);
            double kv = d * (prompt + done + d / 2.0);
            if (has_a)
                kv = kv + a;
            done += d;
            prev = c;
            if (res > 0.0)
                rc = append_row(rows, rid, k_obj, p, d, res, start - lo, kv, pf);
            else if (p != 0.0 || d != 0.0)
                rc = append_row(rows, rid, k_obj, p, d, 0.0, 0.0, kv, 0.0);
        } else if (res > 0.0) {
            rc = append_row(rows, rid, k_obj, p, 0.0, res, start - lo, a, pf);
        } else if (p != 0.0) {
            rc = append_row(rows, rid, k_obj, p, 0.0, 0.0, 0.0, a, 0.0);
        }
        Py_DECREF(k_obj);
        if (rc < 0)
            goto error;
    }
    return rows;
error:
    Py_DECREF(rows);
    return NULL;
}

/* heads.py's cusum_split, the same operations in the same order: over the reads whose wall
   times (times + off) lie in [s, e], the read where the count of events departs most from an
   even pace: 1 with (events in the head, the cut's wall time, the departure) in *got, *cut,
   *best; 0 with fewer than two reads there; -1 with an error set. */
static int split_of(PyObject *times, PyObject *cum, double off, double s, double e,
                    long long *got, double *cut, double *best) {
    int failed = 0;
    Py_ssize_t n_times = PyTuple_GET_SIZE(times);
    Py_ssize_t i0 = bisect_left(times, s - off, &failed);
    Py_ssize_t i1 = failed ? 0 : bisect_left(times, e - off, &failed);
    if (failed)
        return -1;
    while (i1 < n_times) {
        double t = PyFloat_AsDouble(PyTuple_GET_ITEM(times, i1));
        if (t == -1.0 && PyErr_Occurred())
            return -1;
        if (!(t + off <= e))
            break;
        i1++;
    }
    if (i1 - i0 < 2 || e <= s)
        return 0;
    long long base = 0, n;
    if (cum != Py_None && i0 > 0) {
        base = PyLong_AsLongLong(PyList_GET_ITEM(cum, i0 - 1));
        if (base == -1 && PyErr_Occurred())
            return -1;
    }
    if (cum == Py_None) {
        n = (long long)(i1 - i0);
    } else {
        n = PyLong_AsLongLong(PyList_GET_ITEM(cum, i1 - 1));
        if (n == -1 && PyErr_Occurred())
            return -1;
        n -= base;
    }
    *best = -1.0;
    *cut = s;
    *got = 0;
    for (Py_ssize_t i = i0; i < i1 - 1; i++) {
        long long c;
        if (cum == Py_None) {
            c = (long long)(i - i0 + 1);
        } else {
            c = PyLong_AsLongLong(PyList_GET_ITEM(cum, i));
            if (c == -1 && PyErr_Occurred())
                return -1;
            c -= base;
        }
        double t = PyFloat_AsDouble(PyTuple_GET_ITEM(times, i));
        if (t == -1.0 && PyErr_Occurred())
            return -1;
        t = t + off;
        double dev = (double)c - (double)n * (t - s) / (e - s);
        if (dev < 0.0)
            dev = -dev;
        if (dev > *best) {
            *best = dev;
            *got = c;
            *cut = t;
        }
    }
    return 1;
}

static int cum_ok(PyObject *cum) {
    if (cum != Py_None && !PyList_Check(cum)) {
        PyErr_SetString(PyExc_TypeError, "cum: a list or None");
        return 0;
    }
    return 1;
}

/* heads.py's cusum_split: (events in the head, the cut's wall time, the departure) or None. */
static PyObject *cusum_split(PyObject *self, PyObject *args) {
    PyObject *times, *cum;
    double off, s, e, cut, best;
    long long got;
    if (!PyArg_ParseTuple(args, "O!Oddd", &PyTuple_Type, &times, &cum, &off, &s, &e))
        return NULL;
    if (!cum_ok(cum))
        return NULL;
    int found = split_of(times, cum, off, s, e, &got, &cut, &best);
    if (found < 0)
        return NULL;
    if (found == 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(Ldd)", got, cut, best);
}

/* A 9-tuple of row's first eight items' objects (the indices in `keep`, in order) and the
   doubles of `extra` where keep holds -1, in order. */
static PyObject *row_of(PyObject *row, const int keep[9], const double *extra) {
    PyObject *out = PyTuple_New(9);
    if (out == NULL)
        return NULL;
    for (int i = 0; i < 9; i++) {
        PyObject *v;
        if (keep[i] >= 0) {
            v = PyTuple_GET_ITEM(row, keep[i]);
            Py_INCREF(v);
        } else {
            v = PyFloat_FromDouble(*extra++);
            if (v == NULL) {
                Py_DECREF(out);
                return NULL;
            }
        }
        PyTuple_SET_ITEM(out, i, v);
    }
    untrack(out);
    return out;
}

static int field(PyObject *row, int i, double *out) {
    *out = PyFloat_AsDouble(PyTuple_GET_ITEM(row, i));
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

/* heads.py's with_heads for rows of a request with token events (times a non-empty tuple,
   per_event > 0), the same operations in the same order. Row fields: 0 request, 1 interval,
   2 prefill, 3 decode, 4 residency, 5 start, 6 kv, 7 the prefill's seconds. */
static PyObject *with_heads(PyObject *self, PyObject *args) {
    PyObject *rows, *times, *cum;
    double off, interval_s, per_event, first, split_s, min_shift;
    static const int none[9] = {0, 1, 2, 3, 4, 5, 6, 7, -1};  /* (*r, 0.0) */
    static const int whole[9] = {0, 1, 2, 3, 4, 5, 6, 4, 3};  /* the whole span, all decode */
    static const int cut_at[9] = {0, 1, 2, 3, 4, 5, 6, -1, -1};
    if (!PyArg_ParseTuple(args, "O!O!Odddddd", &PyList_Type, &rows, &PyTuple_Type, &times, &cum,
                          &off, &interval_s, &per_event, &first, &split_s, &min_shift))
        return NULL;
    if (!cum_ok(cum))
        return NULL;
    if (PyTuple_GET_SIZE(times) == 0) {
        PyErr_SetString(PyExc_ValueError, "times: none");
        return NULL;
    }
    double t_first = PyFloat_AsDouble(PyTuple_GET_ITEM(times, 0));
    if (t_first == -1.0 && PyErr_Occurred())
        return NULL;
    t_first = t_first + off;
    Py_ssize_t n_rows = PyList_GET_SIZE(rows);
    PyObject *out = PyList_New(n_rows);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t j = 0; j < n_rows; j++) {
        PyObject *r = PyList_GET_ITEM(rows, j);
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 8) {
            PyErr_SetString(PyExc_TypeError, "rows: tuples of 8");
            goto error;
        }
        double res, pf, d, start, k;
        if (field(r, 4, &res) < 0 || field(r, 7, &pf) < 0 || field(r, 3, &d) < 0)
            goto error;
        PyObject *row;
        double zero = 0.0;
        if (d <= 0.0 || pf >= split_s || res <= 0.0) {
            row = row_of(r, none, &zero);
        } else {
            if (field(r, 1, &k) < 0 || field(r, 5, &start) < 0)
                goto error;
            double s = k * interval_s + start;
            double e = s + res;
            long long got = 0;
            double cut = 0.0, best = 0.0;
            int found = 0;
            if (res >= 2.0 * split_s) {
                found = split_of(times, cum, off, s, e, &got, &cut, &best);
                if (found < 0)
                    goto error;
            }
            if (!found || best < min_shift || cut - s < split_s || e - cut < split_s) {
                row = row_of(r, whole, NULL);
            } else {
                double dh = (double)got * per_event - (t_first >= s ? first : 0.0);
                dh = 0.0 > dh ? 0.0 : dh;  /* max(dh, 0.0) */
                dh = d < dh ? d : dh;  /* min(dh, d) */
                double extra[2] = {cut - s, dh};
                row = row_of(r, cut_at, extra);
            }
        }
        if (row == NULL)
            goto error;
        PyList_SET_ITEM(out, j, row);
    }
    return out;
error:
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"streamed_rows", streamed_rows, METH_VARARGS,
     "work.py's _streamed_rows loop: (rid, times, cum | None, total, off, completion, prompt, "
     "prefill, attention, t_disp, t_end, t_pf, k_first, k_last, interval_s, span, k_r0, k_rl, "
     "first)"},
    {"cusum_split", cusum_split, METH_VARARGS,
     "heads.py's cusum_split: (times, cum | None, off, s, e) -> (events, cut, departure) | None"},
    {"with_heads", with_heads, METH_VARARGS,
     "heads.py's with_heads for a request with token events: (rows, times, cum | None, off, "
     "interval_s, per_event, first, split_s, min_shift_events) -> rows with their heads"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_streamed", NULL, -1, methods};

PyMODINIT_FUNC PyInit__streamed(void) { return PyModule_Create(&module); }
