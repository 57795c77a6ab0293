package pybridge

/*
#include "pbgo.h"
*/
import "C"

import (
	"math"
	"sync"
	"time"
	"unsafe"
)

// CPU is the device code of host memory; Device returns it under the gloo backend.
const CPU = -1

// Group is this process's membership in the process group. One group may be
// live per process; Close it before calling Init again.
//
// A Group's methods and the collectives may be called from any goroutine. The
// library serializes its calls, but collectives are matched across ranks by
// their order alone: when several goroutines issue collectives, the program
// must make every rank issue them in the same order.
type Group struct {
	h                             *C.pb_group
	rank, size, localRank, device int

	mu     sync.Mutex
	closed bool
}

type config struct {
	initMethod, backend        string
	rank, worldSize, localRank int
	timeout                    time.Duration
}

// Option configures Init.
type Option func(*config)

// WithInitMethod sets the rendezvous: "env://" (the default; reads MASTER_ADDR
// and MASTER_PORT), "tcp://host:port" or "file:///path".
func WithInitMethod(method string) Option { return func(c *config) { c.initMethod = method } }

// WithBackend chooses "auto" (the default: nccl when CUDA is present, else gloo),
// "gloo" or "nccl". Collectives on Go slices need host memory, that is gloo.
func WithBackend(backend string) Option { return func(c *config) { c.backend = backend } }

// WithRank sets this process's rank; by default it comes from RANK.
func WithRank(rank int) Option { return func(c *config) { c.rank = rank } }

// WithWorldSize sets the number of ranks; by default it comes from WORLD_SIZE.
func WithWorldSize(n int) Option { return func(c *config) { c.worldSize = n } }

// WithLocalRank sets the rank on this node; by default it comes from LOCAL_RANK
// (or equals the rank when that is unset).
func WithLocalRank(rank int) Option { return func(c *config) { c.localRank = rank } }

// WithTimeout bounds the rendezvous and every later collective. Zero or less
// keeps the library's default (300 s).
func WithTimeout(d time.Duration) Option { return func(c *config) { c.timeout = d } }

// Init joins the process group. Whatever the options leave unset comes from
// the launcher's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT, as torchrun and pybridge-launch set them).
//
// Init fails with ErrAlreadyInitialized while another group is live, with
// ErrTimeout when a peer does not join within the timeout, and with
// ErrInvalidArgument for bad options or a missing environment.
func Init(opts ...Option) (*Group, error) {
	const op = "Init"
	c := config{rank: -1, worldSize: -1, localRank: -1}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	rank, err := toInt32(op, "rank", c.rank)
	if err != nil {
		return nil, err
	}
	size, err := toInt32(op, "world size", c.worldSize)
	if err != nil {
		return nil, err
	}
	local, err := toInt32(op, "local rank", c.localRank)
	if err != nil {
		return nil, err
	}
	var method, backend *C.char // NULL selects the library's default
	if c.initMethod != "" {
		method = C.CString(c.initMethod)
		defer C.free(unsafe.Pointer(method))
	}
	if c.backend != "" {
		backend = C.CString(c.backend)
		defer C.free(unsafe.Pointer(backend))
	}
	var h *C.pb_group
	var msg *C.char
	st := C.pbgo_init(method, backend, rank, size, local, C.double(c.timeout.Seconds()), &h, &msg)
	if err := check(op, st, msg); err != nil {
		return nil, err
	}
	var info [4]C.int32_t
	msg = nil
	st = C.pbgo_info(h, &info[0], &msg)
	if err := check(op, st, msg); err != nil {
		C.pbgo_finalize(h, nil) // a group we cannot describe is of no use
		return nil, err
	}
	return &Group{h: h, rank: int(info[0]), size: int(info[1]), localRank: int(info[2]),
		device: int(info[3])}, nil
}

// Rank returns this process's rank, or -1 for a nil Group.
func (g *Group) Rank() int {
	if g == nil {
		return -1
	}
	return g.rank
}

// Size returns the number of ranks, or 0 for a nil Group.
func (g *Group) Size() int {
	if g == nil {
		return 0
	}
	return g.size
}

// LocalRank returns the rank on this node, or -1 for a nil Group.
func (g *Group) LocalRank() int {
	if g == nil {
		return -1
	}
	return g.localRank
}

// Device returns the device this rank computes on: a CUDA index under nccl,
// CPU (-1) under gloo and for a nil Group.
func (g *Group) Device() int {
	if g == nil {
		return CPU
	}
	return g.device
}

// Barrier blocks until every rank has called Barrier. Like every collective it
// must be issued in the same order on every rank.
func (g *Group) Barrier() error {
	const op = "Barrier"
	h, err := g.handle(op)
	if err != nil {
		return err
	}
	var msg *C.char
	return check(op, C.pbgo_barrier(h, &msg), msg)
}

// Close leaves the process group. Later calls on the group return ErrClosed;
// closing again returns nil.
func (g *Group) Close() error {
	const op = "Close"
	h, err := g.handle(op)
	if err != nil {
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	g.closed = true
	var msg *C.char
	return check(op, C.pbgo_finalize(h, &msg), msg)
}

// handle returns the C handle. A closed group keeps its handle: the library
// answers PB_ERR_CLOSED for it, so the message comes from one place.
func (g *Group) handle(op string) (*C.pb_group, error) {
	if g == nil || g.h == nil {
		return nil, newError(statusInvalidArgument, op, "nil *Group")
	}
	return g.h, nil
}

// toInt32 converts an int for the C ABI, refusing values that would wrap.
func toInt32(op, what string, v int) (C.int32_t, error) {
	if v < math.MinInt32 || v > math.MaxInt32 {
		return 0, newError(statusInvalidArgument, op, "%s %d does not fit in 32 bits", what, v)
	}
	return C.int32_t(v), nil
}
