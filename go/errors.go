package pybridge

/*
#cgo pkg-config: pybridge
#include "pbgo.h"
*/
import "C"

import (
	"fmt"
	"math"
	"unsafe"
)

// Error is a failure reported by the C library (or detected by this package
// before calling it). Status is the C status code (a negative PB_ERR_* value),
// Op the Go function that failed, and Msg the library's description.
//
// Compare with the sentinel errors using errors.Is, which matches on Status:
//
//	if errors.Is(err, pybridge.ErrTimeout) { ... }
//
// and use errors.As to reach the message and status.
type Error struct {
	Status int
	Op     string
	Msg    string
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
)

// Sentinel errors, one per C status code. Returned errors are *Error values
// that match these with errors.Is.
var (
	ErrInvalidArgument    = &Error{Status: statusInvalidArgument, Msg: "invalid argument"}
	ErrNotInitialized     = &Error{Status: statusNotInitialized, Msg: "process group not initialized"}
	ErrAlreadyInitialized = &Error{Status: statusAlreadyInitialized, Msg: "process group already initialized"}
	ErrTimeout            = &Error{Status: statusTimeout, Msg: "timeout"}
	ErrComm               = &Error{Status: statusComm, Msg: "communication failure"}
	ErrIO                 = &Error{Status: statusIO, Msg: "I/O error"}
	ErrCorrupt            = &Error{Status: statusCorrupt, Msg: "corrupt data"}
	ErrInternal           = &Error{Status: statusInternal, Msg: "internal error"}
	ErrClosed             = &Error{Status: statusClosed, Msg: "closed"}
	// ErrMembership: in an elastic world (ElasticInit) ranks were lost or new ones
	// wait to join; the next world is agreed on. Not a failure: ElasticState.Reset
	// moves onto it (RunElastic does that for you).
	ErrMembership = &Error{Status: statusMembership, Msg: "elastic membership changed"}
)

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

// Is reports whether target is an *Error with the same status, so that
// errors.Is(err, ErrTimeout) holds for every timeout whatever its message.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t != nil && e != nil && t.Status == e.Status
}

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
		text = C.GoString(msg)
		C.free(unsafe.Pointer(msg))
	}
	return &Error{Status: int(st), Op: op, Msg: text}
}

// Version returns the C library's version, e.g. "0.1.0".
func Version() string {
	return C.GoString(C.pb_version())
}
