/* core/codec.py's unpack_times, compiled: a record line's packed read times (little-endian
   64-bit floats) to a tuple of floats in one pass, each checked to be a time a clock reaches
   (0 to MAX_TIME_S, not NaN) as it is read. The accounting child decodes every record's
   times (about a hundred reads a stream); the Python version copies them into an array, then
   into the tuple, and checks them in a third pass. codec.py falls back to it where this
   module was not built; tests/unit/test_codec.py compares the two. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

static PyObject *unpack_times(PyObject *self, PyObject *args) {
    Py_buffer data;
    double max_time_s;
    if (!PyArg_ParseTuple(args, "dy*", &max_time_s, &data))
        return NULL;
    if (data.len % 8) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "read times: not whole 64-bit floats");
        return NULL;
    }
    Py_ssize_t n = data.len / 8;
    PyObject *out = PyTuple_New(n);
    if (out == NULL) {
        PyBuffer_Release(&data);
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)data.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* little-endian on the wire, whatever this machine's order */
        double t = PyFloat_Unpack8((const char *)(p + 8 * i), 1);
        if (t == -1.0 && PyErr_Occurred())
            goto error;
        if (!(t >= 0.0 && t <= max_time_s)) {
            PyErr_SetString(PyExc_ValueError, "read times: outside 0..MAX_TIME_S");
            goto error;
        }
        PyObject *v = PyFloat_FromDouble(t);
        if (v == NULL)
            goto error;
        PyTuple_SET_ITEM(out, i, v);
    }
    PyBuffer_Release(&data);
    /* floats only: in no reference cycle, so the garbage collector need not walk it (CPython
       untracks such a tuple itself, but only once a collection has walked it) */
    PyObject_GC_UnTrack(out);
    return out;
error:
    PyBuffer_Release(&data);
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"unpack_times", unpack_times, METH_VARARGS,
     "codec.py's unpack_times: (max_time_s, data) -> times; ValueError for bytes that are "
     "not times 0..max_time_s"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_times", NULL, -1, methods};

PyMODINIT_FUNC PyInit__times(void) { return PyModule_Create(&module); }
