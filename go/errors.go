package pybridge

/*
#cgo pkg-config: pybridge
#include "pbgo.h"
*/
import "C"

import (
	"fmt"
	"math"
	"strings"
	"unsafe"
)

// Error is a failure reported by the C library (or detected by this package
// before calling it). Status is the C status code (a negative PB_ERR_* value),
// Op the Go function that failed, and Msg the library's description, naming Go's
// functions, types and constants (goNames). Err is the cause this package wraps,
// if any: the context's error (context.Canceled or context.DeadlineExceeded) of a
// call whose context ended (Status is then PB_ERR_CANCELED; see Contexts in the
// package documentation).
//
// Compare with the sentinel errors using errors.Is, which matches on Status (and
// on Err: errors.Is(err, context.DeadlineExceeded)):
//
//	if errors.Is(err, pybridge.ErrTimeout) { ... }
//
// and use errors.As to reach the message and status.
type Error struct {
	Status int
	Op     string
	Msg    string
	Err    error
}

// Status codes: pybridge.h's, the one source of every ABI constant.
const (
	statusOK                 = C.PB_OK
	statusInvalidArgument    = C.PB_ERR_INVALID_ARGUMENT
	statusNotInitialized     = C.PB_ERR_NOT_INITIALIZED
	statusAlreadyInitialized = C.PB_ERR_ALREADY_INITIALIZED
	statusTimeout            = C.PB_ERR_TIMEOUT
	statusComm               = C.PB_ERR_COMM
	statusIO                 = C.PB_ERR_IO
	statusCorrupt            = C.PB_ERR_CORRUPT
	statusInternal           = C.PB_ERR_INTERNAL
	statusClosed             = C.PB_ERR_CLOSED
	statusMembership         = C.PB_ERR_MEMBERSHIP
	statusCanceled           = C.PB_ERR_CANCELED
)

// sentinel is the type of the sentinel errors: they are constants, so no program can
// reassign them, and errors.Is matches every *Error of their status against them.
type sentinel int

// Sentinel errors, one per C status code. Returned errors are *Error values
// that match these with errors.Is.
const (
	ErrInvalidArgument    sentinel = statusInvalidArgument
	ErrNotInitialized     sentinel = statusNotInitialized
	ErrAlreadyInitialized sentinel = statusAlreadyInitialized
	ErrTimeout            sentinel = statusTimeout
	ErrComm               sentinel = statusComm
	ErrIO                 sentinel = statusIO
	ErrCorrupt            sentinel = statusCorrupt
	ErrInternal           sentinel = statusInternal
	ErrClosed             sentinel = statusClosed
	// ErrMembership: in an elastic world (ElasticInit) ranks were lost or new ones
	// wait to join; the next world is agreed on. Not a failure: ElasticState.Reset
	// moves onto it (RunElastic does that for you).
	ErrMembership sentinel = statusMembership
	// ErrCanceled: the call's context ended (errors.Is(err, context.Canceled) or
	// context.DeadlineExceeded tells which); a call that had started aborted its group
	// (see Contexts in the package documentation).
	ErrCanceled sentinel = statusCanceled
)

func (s sentinel) Error() string {
	switch s {
	case ErrInvalidArgument:
		return "pybridge: invalid argument"
	case ErrNotInitialized:
		return "pybridge: process group not initialized"
	case ErrAlreadyInitialized:
		return "pybridge: process group already initialized"
	case ErrTimeout:
		return "pybridge: timeout"
	case ErrComm:
		return "pybridge: communication failure"
	case ErrIO:
		return "pybridge: I/O error"
	case ErrCorrupt:
		return "pybridge: corrupt data"
	case ErrInternal:
		return "pybridge: internal error"
	case ErrClosed:
		return "pybridge: closed"
	case ErrMembership:
		return "pybridge: elastic membership changed"
	case ErrCanceled:
		return "pybridge: canceled"
	}
	return "pybridge: " + StatusName(int(s))
}

// StatusName returns the C constant name of a status code, e.g. "PB_ERR_TIMEOUT".
func StatusName(status int) string {
	if status < math.MinInt32 || status > math.MaxInt32 {
		return "PB_UNKNOWN"
	}
	return C.GoString(C.pb_status_name(C.int(status))) // pure C: needs no Python core
}

func (e *Error) Error() string {
	if e.Op == "" {
		return "pybridge: " + e.Msg
	}
	msg := e.Msg
	if msg == "" {
		msg = "failed"
	}
	return fmt.Sprintf("pybridge: %s: %s [%s]", e.Op, msg, StatusName(e.Status))
}

// Is reports whether target is a sentinel (or an *Error) with the same status, so
// that errors.Is(err, ErrTimeout) holds for every timeout whatever its message.
func (e *Error) Is(target error) bool {
	if e == nil {
		return false
	}
	switch t := target.(type) {
	case sentinel:
		return e.Status == int(t)
	case *Error:
		return t != nil && t.Status == e.Status
	}
	return false
}

// Unwrap returns the cause this package wrapped (a context's error), or nil.
func (e *Error) Unwrap() error { return e.Err }

// newError builds an error that this package detects itself.
func newError(status int, op, format string, args ...any) error {
	return &Error{Status: status, Op: op, Msg: fmt.Sprintf(format, args...)}
}

// check turns a helper's status and copied message into an error, freeing the copy.
// Every library call ends here, so it also paces the scheduler (see sched.go).
func check(op string, st C.int, msg *C.char) error {
	paceCgo()
	if st == statusOK {
		return nil
	}
	text := ""
	if msg != nil {
		text = goWords(C.GoString(msg))
		C.free(unsafe.Pointer(msg))
	}
	return &Error{Status: int(st), Op: op, Msg: text}
}

// goNames: the C names that library messages hold (functions, types, statuses, flags
// and settings), and what Go calls them. The C library writes C's names
// (pybridge/capi/names.py turns the core's Python ones into these); goWords turns them
// into Go's, once, where the error is built. The constants that a Go constant stands
// for (HookFP16 Hook = C.PB_HOOK_FP16) are not here: capi/gen_abi.py generates them
// (goConstants, names_gen.go), and an entry here wins over one there. A name in
// neither stays as it is.
var goNames = map[string]string{
	// functions
	"pb_init":                   "Init",
	"pb_init_v2":                "Init",
	"pb_finalize":               "Group.Close",
	"pb_group_close":            "Group.Close",
	"pb_broadcast_params":       "BroadcastParams",
	"pb_reducer_create":         "NewReducer",
	"pb_reducer_attach":         "AttachReducer",
	"pb_reducer_mark_ready":     "Reducer.MarkReady",
	"pb_reducer_wait":           "Reducer.Wait",
	"pb_reducer_poll":           "Reducer.WaitContext",
	"pb_reducer_join":           "Reducer.Join",
	"pb_reducer_bind_grads":     "Reducer.BindGrads",
	"pb_reducer_zero":           "Reducer.Zero",
	"pb_reducer_close":          "Reducer.Close",
	"pb_checkpoint_save":        "Checkpoint.Save",
	"pb_checkpoint_restore":     "Checkpoint.Restore",
	"pb_any_rank":               "AnyRank",
	"pb_elastic_init":           "ElasticInit",
	"pb_elastic_finish":         "RunElastic",
	"pb_elastic_last_change":    "LastElasticChange",
	"pb_state_commit":           "ElasticState.Commit",
	"pb_state_restore":          "ElasticState.Restore",
	"pb_state_sync":             "ElasticState.Sync",
	"pb_state_reset":            "ElasticState.Reset",
	"pb_fed_server_next_result": "FedServer.Next",
	"pb_fed_worker_next_task":   "FedWorker.Next",
	"pb_fed_worker_submit":      "FedWorker.Submit",
	"pb_fed_worker_fail":        "FedWorker.Fail",
	"pb_observe_start":          "StartObserve",
	"pb_job_env":                "FromLaunchEnv",
	"pb_diloco_create":          "NewDiLoCo",
	"pb_diloco_step":            "DiLoCo.Step",
	"pb_diloco_close":           "DiLoCo.Close",
	"pb_diloco_options":         "DiLoCoOption",
	// handle types
	"pb_group":      "Group",
	"pb_buffer":     "Buffer",
	"pb_work":       "Work",
	"pb_loader":     "Loader",
	"pb_reducer":    "Reducer",
	"pb_averager":   "Averager",
	"pb_state":      "ElasticState",
	"pb_fed_server": "FedServer",
	"pb_fed_worker": "FedWorker",
	"pb_diloco":     "DiLoCo",
	// element types: the Go types
	"PB_FLOAT32":  "float32",
	"PB_FLOAT64":  "float64",
	"PB_FLOAT16":  "Float16",
	"PB_BFLOAT16": "BFloat16",
	"PB_INT8":     "int8",
	"PB_UINT8":    "uint8",
	"PB_INT32":    "int32",
	"PB_INT64":    "int64",
	// statuses: the sentinel errors
	"PB_ERR_INVALID_ARGUMENT":    "ErrInvalidArgument",
	"PB_ERR_NOT_INITIALIZED":     "ErrNotInitialized",
	"PB_ERR_ALREADY_INITIALIZED": "ErrAlreadyInitialized",
	"PB_ERR_TIMEOUT":             "ErrTimeout",
	"PB_ERR_COMM":                "ErrComm",
	"PB_ERR_IO":                  "ErrIO",
	"PB_ERR_CORRUPT":             "ErrCorrupt",
	"PB_ERR_INTERNAL":            "ErrInternal",
	"PB_ERR_CLOSED":              "ErrClosed",
	"PB_ERR_MEMBERSHIP":          "ErrMembership",
	"PB_ERR_CANCELED":            "ErrCanceled",
	// settings: the options that set them
	"bucket_cap_mb":       "WithBucketCapMB",
	"first_bucket_cap_mb": "WithFirstBucketCapMB",
	// flags: the options that set them
	"PB_INIT_CHECKED":                  "WithChecked",
	"PB_REDUCER_ALLOW_UNUSED":          "WithAllowUnused",
	"PB_REDUCER_NO_REBUILD":            "WithoutRebuild",
	"PB_REDUCER_JOIN":                  "WithJoin",
	"PB_REDUCER_JOIN_DIVIDE_BY_ACTIVE": "WithJoinDivideByActive",
	"PB_REDUCER_BUCKET_VIEW":           "WithGradAsBucketView",
	// a message's PB_TORCH_TENSOR is a tensor handle: the TorchTensor source, not the DType
	"PB_TORCH_TENSOR": "TorchTensor",
}

// goWords returns a library message in Go's names: the C function it starts with
// goes (Error.Op names the Go one), and each word that is a C name of goNames or
// goConstants becomes Go's (whole words only: pb_reducer_wait is not pb_reducer's).
func goWords(msg string) string {
	if name, rest, ok := strings.Cut(msg, ": "); ok && strings.HasPrefix(name, "pb_") && cIdent(name) == len(name) {
		msg = rest
	}
	var b strings.Builder
	for i := 0; i < len(msg); {
		if n := cIdent(msg[i:]); n > 0 {
			name := msg[i : i+n]
			if goName, ok := goNames[name]; ok {
				b.WriteString(goName)
			} else if goName, ok := goConstants[name]; ok {
				b.WriteString(goName)
			} else {
				b.WriteString(name)
			}
			i += n
			continue
		}
		b.WriteByte(msg[i])
		i++
	}
	return b.String()
}

// cIdent returns the length of the C identifier characters s starts with.
func cIdent(s string) int {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return i
		}
	}
	return len(s)
}

// Version returns the C library's version, e.g. "0.1.0".
func Version() string {
	return C.GoString(C.pb_version())
}
