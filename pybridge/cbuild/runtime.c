/*
 * The hand-written C part of libpybridge.so: the thread-local error message, starting the
 * embedded interpreter, and the pure-C functions (pb_last_error, pb_version,
 * pb_status_name). Not compiled on its own: pybridge/cbuild/gen.py fills in the version,
 * the interpreter and the status names (the @-delimited placeholders) from the build and
 * the header, appends the generated wrapper of every other pb_* function, and cffi
 * compiles the result (it supplies Python.h and CFFI_DLLEXPORT).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pybridge.h"

#define PB_ERRMSG_MAX 4096
static __thread char pb_errmsg[PB_ERRMSG_MAX];
static volatile int pb_core_ready = 0;
static char pb_start_error[PB_ERRMSG_MAX] = "the pybridge Python core failed to start "
    "(see the traceback on stderr)";

/* Called from Python (pybridge/capi/) on the calling thread. */
static void _pb_set_error(const char *msg) {
    snprintf(pb_errmsg, sizeof pb_errmsg, "%s", msg);
}
static void _pb_set_ready(void) { pb_core_ready = 1; }
static void _pb_set_start_error(const char *msg) {
    snprintf(pb_start_error, sizeof pb_start_error, "pybridge core failed to start: %s", msg);
}

static volatile int pb_core_failed = 0;  /* cffi's start-up failed: never re-enter it */

static int pb_not_ready(void) {
    snprintf(pb_errmsg, sizeof pb_errmsg, "%s", pb_start_error);
    return PB_ERR_INTERNAL;
}

/* Start the interpreter ourselves, before cffi would: left to itself, an embedded
 * Python locates its prefix by searching PATH for "python3", which can be another
 * installation, and ignores a virtual environment. Naming the build's interpreter
 * (or $PYBRIDGE_PYTHON) as the executable gives the same sys.prefix and
 * site-packages as running that interpreter. No signal handlers are installed. */
static pthread_once_t pb_python_once = PTHREAD_ONCE_INIT;
static int pb_python_ok = 0;
static int pb_python_ours = 0;  /* we started the interpreter (not loaded into a running one) */

static int _pb_python_started_here(void) { return pb_python_ours; }

/* cffi (< 2.1) serializes its start-up with a spin lock on PyCapsule_Type.tp_version_tag
 * on Python < 3.12 and spins for ever if that tag is already set, which happens once
 * any code has looked up a capsule attribute (importing torch does). Invalidating the
 * tag through the public API (the GIL held) lets cffi's lock proceed. */
static void pb_unblock_cffi_lock(void) {
#if PY_VERSION_HEX < 0x030C0000
    PyType_Modified(&PyCapsule_Type);
#endif
}

static void pb_start_python(void) {
    if (Py_IsInitialized()) {  /* loaded into a running Python */
        PyGILState_STATE gil = PyGILState_Ensure();
        pb_unblock_cffi_lock();
        PyGILState_Release(gil);
        pb_python_ok = 1;
        return;
    }
    const char *exe = getenv("PYBRIDGE_PYTHON");
    if (exe == NULL || exe[0] == '\0')
        exe = "@PYTHON@";
    PyConfig config;
    PyConfig_InitPythonConfig(&config);
    config.install_signal_handlers = 0;
    config.parse_argv = 0;
    PyStatus status = PyConfig_SetBytesString(&config, &config.executable, exe);
    if (!PyStatus_Exception(status))
        status = PyConfig_SetBytesString(&config, &config.program_name, exe);
    if (!PyStatus_Exception(status))
        status = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(status)) {
        snprintf(pb_start_error, sizeof pb_start_error,
                 "pybridge core failed to start: Python (%s) did not initialize: %s",
                 exe, status.err_msg ? status.err_msg : "unknown error");
        return;
    }
    pb_unblock_cffi_lock();
    PyEval_SaveThread();  /* release the GIL: every call takes it through cffi */
    pb_python_ours = 1;
    pb_python_ok = 1;
}

/* Give each calling OS thread a Python thread state that lives as long as the thread.
 * Otherwise cffi creates and destroys one around every call made from a thread that
 * Python did not start, which is every call from a Go program (goroutines run on
 * threads of Go's own). */
static __thread int pb_thread_attached = 0;

static int pb_python_ready(void) {
    pthread_once(&pb_python_once, pb_start_python);
    if (pb_python_ok && !pb_thread_attached) {
        pb_thread_attached = 1;
        if (PyGILState_GetThisThreadState() == NULL) {
            PyGILState_Ensure();  /* never released: keeps the thread state */
            PyEval_SaveThread();
        }
    }
    return pb_python_ok;
}

/* Under pybridge-launch a rank's stdout is a log file, which C's stdio fills in 4 KiB blocks
 * before it writes: the launcher sets PYBRIDGE_LINE_BUFFERED=1 so that a C or C++ rank's lines
 * reach the console as it prints them, as on a terminal. Done as the library loads, before
 * the program has written anything (setvbuf must come first). */
__attribute__((constructor)) static void pb_line_buffered_stdout(void) {
    const char *v = getenv("PYBRIDGE_LINE_BUFFERED");
    if (v != NULL && strcmp(v, "1") == 0)
        setvbuf(stdout, NULL, _IOLBF, 0);
}

CFFI_DLLEXPORT const char *pb_last_error(void) { return pb_errmsg; }

CFFI_DLLEXPORT const char *pb_version(void) { return "@VERSION@"; }

CFFI_DLLEXPORT const char *pb_status_name(int status) {
    switch (status) {
@STATUS_CASES@
    default: return "PB_UNKNOWN";
    }
}
