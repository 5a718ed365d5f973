/* accounting/ledger/base.py's RequestRow.from_record, compiled: a finished request's ledger
   row built from its record and its work rows, with the same arithmetic on the same doubles
   (built with -ffp-contract=off), so the same values (tests/accounting/test_untracked_values.py
   compares the two). The row holds only strings, numbers and None, so it is built out of the
   garbage collector's sight. A record whose times are not floats (an int a test built) goes
   to the Python method. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>

#define HOUR_S 3600.0
#define FIELDS 21

/* The record's fields read, by names interned once at import (PyObject_GetAttrString makes
   the name's string at every call: slower than the Python method) */
static const char *const NAMES[] = {
    "arrived_wall_s", "arrived_s", "finished_s", "engine", "dispatched_s", "read_times",
    "request_id", "tenant", "model", "engine", "precision", "slo_class", "status",
    "stream", "slo_met", "prompt_tokens", "completion_tokens", "prompt_source", "http_status",
    "outcome"};
#define N_NAMES ((int)(sizeof(NAMES) / sizeof(NAMES[0])))
enum {ARRIVED_WALL, ARRIVED, FINISHED, ENGINE, DISPATCHED, READ_TIMES, FIRST_SEVEN,
      STREAM = FIRST_SEVEN + 7, SLO_MET, LAST_FIVE};
static PyObject *interned[N_NAMES];

static PyObject *get(PyObject *o, int name) { return PyObject_GetAttr(o, interned[name]); }

static int as_double(PyObject *rec, int name, double *out, PyObject **obj) {
    PyObject *v = get(rec, name);
    if (v == NULL)
        return -1;
    if (!PyFloat_CheckExact(v)) {
        Py_DECREF(v);
        return 1;  /* not a float: the Python method */
    }
    *out = PyFloat_AS_DOUBLE(v);
    if (obj != NULL)
        *obj = v;
    else
        Py_DECREF(v);
    return 0;
}

static PyObject *floor_int(double x) { return PyLong_FromDouble(floor(x)); }

/* request_row(cls, rec, interval_s, replica, work) -> cls row */
static PyObject *request_row(PyObject *self, PyObject *args) {
    PyObject *cls, *rec, *replica, *work;
    double interval_s;
    if (!PyArg_ParseTuple(args, "OOdOO!", &cls, &rec, &interval_s, &replica, &PyList_Type, &work))
        return NULL;
    PyObject *row = NULL, *arrived_obj = NULL, *times = NULL, *v = NULL;
    PyObject *first = NULL, *last = NULL, *delivered = NULL;
    double arrived_wall, arrived, finished_s;
    int got;
    if ((got = as_double(rec, ARRIVED_WALL, &arrived_wall, &arrived_obj)) != 0
        || (got = as_double(rec, ARRIVED, &arrived, NULL)) != 0
        || (got = as_double(rec, FINISHED, &finished_s, NULL)) != 0)
        goto slow_or_error;
    double finished = arrived_wall + (finished_s - arrived);
    /* ran = bool(rec.engine) and rec.dispatched_s is not None */
    v = get(rec, ENGINE);
    if (v == NULL)
        goto error;
    int ran = PyObject_IsTrue(v);
    Py_CLEAR(v);
    if (ran < 0)
        goto error;
    if (ran) {
        v = get(rec, DISPATCHED);
        if (v == NULL)
            goto error;
        ran = v != Py_None;
        Py_CLEAR(v);
    }
    if (ran && (last = floor_int(finished / interval_s)) == NULL)
        goto error;
    Py_ssize_t n = PyList_GET_SIZE(work);
    if (n) {
        PyObject *lo = NULL, *hi = NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *w = PyList_GET_ITEM(work, i);
            if (!PyTuple_Check(w) || PyTuple_GET_SIZE(w) < 2) {
                PyErr_SetString(PyExc_TypeError, "a work row is not a tuple");
                goto error;
            }
            PyObject *k = PyTuple_GET_ITEM(w, 1);
            if (lo == NULL) {
                lo = hi = k;
                continue;
            }
            /* min() and max(): the first of equal keys is kept */
            int less = PyObject_RichCompareBool(k, lo, Py_LT);
            int more = less ? 0 : PyObject_RichCompareBool(k, hi, Py_GT);
            if (less < 0 || more < 0)
                goto error;
            if (less)
                lo = k;
            if (more)
                hi = k;
        }
        first = Py_NewRef(lo);
        int later = last == NULL ? 1 : PyObject_RichCompareBool(hi, last, Py_GT);
        if (later < 0)
            goto error;
        if (later)
            Py_XSETREF(last, Py_NewRef(hi));
    }
    times = get(rec, READ_TIMES);
    if (times == NULL)
        goto error;
    if (!PyTuple_Check(times)) {
        got = 1;
        goto slow_or_error;
    }
    if (PyTuple_GET_SIZE(times)) {
        PyObject *t = PyTuple_GET_ITEM(times, PyTuple_GET_SIZE(times) - 1);
        if (!PyFloat_CheckExact(t)) {
            got = 1;
            goto slow_or_error;
        }
        delivered = PyFloat_FromDouble(arrived_wall + (PyFloat_AS_DOUBLE(t) - arrived));
        if (delivered == NULL)
            goto error;
    }
    row = ((PyTypeObject *)cls)->tp_alloc((PyTypeObject *)cls, FIELDS);
    if (row == NULL)
        goto error;
    for (int i = 0; i < 7; i++) {
        if ((v = get(rec, FIRST_SEVEN + i)) == NULL)
            goto error;
        PyTuple_SET_ITEM(row, i, v);
    }
    static const int flag_at[] = {7, 13};
    for (int i = 0; i < 2; i++) {
        if ((v = get(rec, STREAM + i)) == NULL)
            goto error;
        int on = PyObject_IsTrue(v);
        Py_DECREF(v);
        if (on < 0)
            goto error;
        PyTuple_SET_ITEM(row, flag_at[i], PyLong_FromLong(on));
    }
    PyTuple_SET_ITEM(row, 8, Py_NewRef(arrived_obj));
    if ((v = PyFloat_FromDouble(finished)) == NULL)
        goto error;
    PyTuple_SET_ITEM(row, 9, v);
    if ((v = floor_int(finished / HOUR_S)) == NULL)
        goto error;
    PyTuple_SET_ITEM(row, 10, v);
    static const int at[] = {11, 12, 17, 18, 19};
    for (int i = 0; i < 5; i++) {
        if ((v = get(rec, LAST_FIVE + i)) == NULL)
            goto error;
        PyTuple_SET_ITEM(row, at[i], v);
    }
    PyTuple_SET_ITEM(row, 14, first != NULL ? first : Py_NewRef(Py_None));
    PyTuple_SET_ITEM(row, 15, last != NULL ? last : Py_NewRef(Py_None));
    first = last = NULL;
    PyTuple_SET_ITEM(row, 16, Py_NewRef(replica));
    PyTuple_SET_ITEM(row, 20, delivered != NULL ? delivered : Py_NewRef(Py_None));
    delivered = NULL;
    for (int i = 0; i < FIELDS; i++)
        if (PyObject_GC_IsTracked(PyTuple_GET_ITEM(row, i)))
            goto done;
    PyObject_GC_UnTrack(row);  /* strings, numbers and None: in no cycle */
done:
    Py_DECREF(arrived_obj);
    Py_DECREF(times);
    return row;
slow_or_error:
    if (got > 0) {  /* not floats: the Python method */
        Py_XDECREF(arrived_obj);
        Py_XDECREF(times);
        Py_XDECREF(first);
        Py_XDECREF(last);
        Py_XDECREF(delivered);
        return PyObject_CallMethod(cls, "from_record", "OdOO", rec, interval_s, replica, work);
    }
error:
    Py_XDECREF(row);
    Py_XDECREF(arrived_obj);
    Py_XDECREF(times);
    Py_XDECREF(first);
    Py_XDECREF(last);
    Py_XDECREF(delivered);
    return NULL;
}

static PyMethodDef methods[] = {
    {"request_row", request_row, METH_VARARGS,
     "RequestRow.from_record compiled: (cls, rec, interval_s, replica, work: list) -> row"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_requestrow", NULL, -1, methods};

PyMODINIT_FUNC PyInit__requestrow(void) {
    for (int i = 0; i < N_NAMES; i++)
        if (interned[i] == NULL && (interned[i] = PyUnicode_InternFromString(NAMES[i])) == NULL)
            return NULL;
    return PyModule_Create(&module);
}
