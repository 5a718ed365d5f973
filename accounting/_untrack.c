/* The accounting child's values out of the garbage collector's sight.

   A record, its latency and its request row hold only strings, numbers and tuples of them:
   none of them can be in a reference cycle, yet CPython tracks every instance of a class
   with slots (and every named tuple), so each collection walks the records and rows that wait
   for the next flush, and a full collection walks them all (a sixth of the child's CPU per
   record went to the collector). `untrack` takes such values off the collector's lists: an
   object is untracked only when nothing it refers to is tracked, once the tuples it holds
   (and the values of the types in `nested` it holds) are untracked by the same rule. Its
   own class, which a heap type's instance refers to, does not count: the records' classes
   live as long as the process. Lists, dicts and sets, whose contents may change, are never
   untracked. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define DEPTH 3  /* a record -> its latency -> a tuple of floats */

typedef struct {
    PyObject *self_type;  /* the referent not counted: the object's own (heap) type */
    PyObject *nested;     /* a tuple of types whose instances may be untracked inside */
    int depth;
} Walk;

static int settle(PyObject *obj, PyObject *nested, int depth);

static int visit(PyObject *ref, void *arg) {
    Walk *w = (Walk *)arg;
    if (ref == w->self_type || !PyObject_GC_IsTracked(ref))
        return 0;
    if (w->depth < DEPTH && (PyTuple_CheckExact(ref)
                             || PySequence_Contains(w->nested, (PyObject *)Py_TYPE(ref)) == 1)
        && settle(ref, w->nested, w->depth + 1))
        return 0;
    return 1;  /* a tracked referent: stop, `obj` stays tracked */
}

/* 1 when `obj` is (now) untracked */
static int settle(PyObject *obj, PyObject *nested, int depth) {
    if (!PyObject_GC_IsTracked(obj))
        return 1;
    if (PyList_Check(obj) || PyDict_Check(obj) || PyAnySet_Check(obj) || PyType_Check(obj))
        return 0;
    traverseproc traverse = Py_TYPE(obj)->tp_traverse;
    if (traverse == NULL)
        return 0;
    Walk w = {(PyObject *)Py_TYPE(obj), nested, depth};
    if (traverse(obj, visit, &w))
        return 0;
    PyObject_GC_UnTrack(obj);
    return 1;
}

static PyObject *untrack(PyObject *self, PyObject *args) {
    PyObject *objs, *nested;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &objs, &PyTuple_Type, &nested))
        return NULL;
    Py_ssize_t done = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(objs); i++) {
        PyObject *obj = PyList_GET_ITEM(objs, i);
        int was = PyObject_GC_IsTracked(obj);
        if (settle(obj, nested, 0) && was)
            done++;
    }
    return PyLong_FromSsize_t(done);
}

static PyMethodDef methods[] = {
    {"untrack", untrack, METH_VARARGS,
     "untrack(objs: list, nested: tuple of types) -> how many of objs were untracked: each "
     "object none of whose referents (its own class aside) stays tracked once the tuples and "
     "the `nested` types' instances it holds are untracked by the same rule"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_untrack", NULL, -1, methods};

PyMODINIT_FUNC PyInit__untrack(void) { return PyModule_Create(&module); }
