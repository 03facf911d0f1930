/* llama.cpp's log callback for localchat (localchat/backends/llamacpp_natives.py): the last few error
   lines, kept to explain a failed load or context, and every other line dropped.

   Why C: a callback written in Python takes the GIL for every line llama.cpp logs, about 1,200 to load
   the default model, and the thread that loads it shares the GIL with what the command or the chat app
   imports meanwhile: each line waits until the importing thread lets the GIL go. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <string.h>

/* enum ggml_log_level: NONE, DEBUG, INFO, WARN, ERROR, CONT. */
#define GGML_LOG_LEVEL_ERROR 4
/* How many error lines are kept, and how many bytes of each. */
#define KEPT 8
#define LINE_BYTES 512

/* llama.cpp may log from any thread. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char lines[KEPT][LINE_BYTES];
/* Error lines logged since the last clear; the latest KEPT of them are in `lines`. */
static size_t logged = 0;

/* The callback itself: a ggml_log_callback. */
static void keep_errors(int level, const char *text, void *user_data)
{
    (void)user_data;
    if (level != GGML_LOG_LEVEL_ERROR || text == NULL || text[0] == '\0')
        return;
    pthread_mutex_lock(&lock);
    char *line = lines[logged % KEPT];
    strncpy(line, text, LINE_BYTES - 1);
    line[LINE_BYTES - 1] = '\0';
    logged++;
    pthread_mutex_unlock(&lock);
}

PyDoc_STRVAR(callback_address_doc,
"callback_address() -> int\n\n"
"The address of the log callback, a ggml_log_callback, for llama_log_set.");

static PyObject *callback_address(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyLong_FromVoidPtr((void *)keep_errors);
}

PyDoc_STRVAR(recent_errors_doc,
"recent_errors() -> list[str]\n\n"
"The error lines logged since the last clear_errors(), the latest 8 at most, oldest first, stripped\n"
"of surrounding white space (UTF-8, undecodable bytes replaced).");

static PyObject *recent_errors(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    char copies[KEPT][LINE_BYTES];
    pthread_mutex_lock(&lock);
    size_t count = logged < KEPT ? logged : KEPT, first = logged - count;
    for (size_t i = 0; i < count; i++)
        memcpy(copies[i], lines[(first + i) % KEPT], LINE_BYTES);
    pthread_mutex_unlock(&lock);
    PyObject *found = PyList_New(0);
    if (found == NULL)
        return NULL;
    for (size_t i = 0; i < count; i++) {
        PyObject *line = PyUnicode_DecodeUTF8(copies[i], (Py_ssize_t)strlen(copies[i]), "replace");
        PyObject *stripped = line == NULL ? NULL : PyObject_CallMethod(line, "strip", NULL);
        Py_XDECREF(line);
        if (stripped == NULL || PyList_Append(found, stripped) < 0) {
            Py_XDECREF(stripped);
            Py_DECREF(found);
            return NULL;
        }
        Py_DECREF(stripped);
    }
    return found;
}

PyDoc_STRVAR(clear_errors_doc,
"clear_errors() -> None\n\n"
"Forget the error lines logged so far.");

static PyObject *clear_errors(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    pthread_mutex_lock(&lock);
    logged = 0;
    pthread_mutex_unlock(&lock);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"callback_address", callback_address, METH_NOARGS, callback_address_doc},
    {"recent_errors", recent_errors, METH_NOARGS, recent_errors_doc},
    {"clear_errors", clear_errors, METH_NOARGS, clear_errors_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "localchat.backends._llama_log",
    .m_doc = "llama.cpp's log, its error lines kept without the GIL (see keep_errors).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__llama_log(void)
{
    return PyModule_Create(&module);
}
