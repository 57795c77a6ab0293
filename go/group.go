package pybridge

/*
#include "pbgo.h"
*/
import "C"

import (
	"context"
	"math"
	"time"
	"unsafe"
)

// CPU is the device code of host memory; Device returns it under the gloo backend.
const CPU = C.PB_CPU

// Group is this process's membership in the process group. One group may be
// live per process; Close it before calling Init again.
//
// A Group's methods and the collectives may be called from any goroutine. The
// library serializes its calls, but collectives are matched across ranks by
// their order alone: when several goroutines issue collectives, the program
// must make every rank issue them in the same order.
type Group struct {
	cHandle[*C.pb_group] // the world's handle stays set after Close: see handle

	rank, size, localRank, device int
	ranks                         []int // global rank of each member
	sub                           bool  // a subgroup: Close frees it
}

// config is what the options of Init and ElasticInit set. Its zero values (and -1 for
// ranks and sizes) are the C ABI's "not given": the library's defaults and the
// launcher's environment fill them, in one place.
type config struct {
	initMethod, backend        string
	rank, worldSize, localRank int
	timeout                    time.Duration
	checked                    bool
	watchdog                   time.Duration
	storeAddr                  string // ElasticInit only
}

// Option configures Init. The options that also configure ElasticInit
// (WithBackend, WithTimeout) are WorldOptions.
type Option interface{ applyInit(*config) }

// ElasticOption configures ElasticInit: WithBackend, WithTimeout and
// WithElasticStore.
type ElasticOption interface{ applyElastic(*config) }

// WorldOption configures both Init and ElasticInit.
type WorldOption interface {
	Option
	ElasticOption
}

type initOption func(*config)    // Init's only
type worldOption func(*config)   // Init's and ElasticInit's
type elasticOption func(*config) // ElasticInit's only

func (o initOption) applyInit(c *config)       { o(c) }
func (o worldOption) applyInit(c *config)      { o(c) }
func (o worldOption) applyElastic(c *config)   { o(c) }
func (o elasticOption) applyElastic(c *config) { o(c) }

// WithInitMethod sets the rendezvous: "env://" (the default; reads MASTER_ADDR
// and MASTER_PORT), "tcp://host:port" or "file:///path".
func WithInitMethod(method string) Option {
	return initOption(func(c *config) { c.initMethod = method })
}

// WithBackend chooses "auto" (the default: nccl when CUDA is present, else gloo),
// "gloo" or "nccl". Collectives on Go slices need host memory, that is gloo.
func WithBackend(backend string) WorldOption {
	return worldOption(func(c *config) { c.backend = backend })
}

// WithRank sets this process's rank; by default it comes from the launcher's
// environment (FromLaunchEnv: RANK, or srun's or mpirun's variables).
func WithRank(rank int) Option { return initOption(func(c *config) { c.rank = rank }) }

// WithWorldSize sets the number of ranks; by default it comes from the launcher's
// environment, as the rank does.
func WithWorldSize(n int) Option { return initOption(func(c *config) { c.worldSize = n }) }

// WithLocalRank sets the rank on this node; by default it comes from the
// launcher's environment (or equals the rank when nothing says).
func WithLocalRank(rank int) Option { return initOption(func(c *config) { c.localRank = rank }) }

// WithTimeout bounds the rendezvous and every later collective. Zero or less
// keeps the library's default (300 s).
func WithTimeout(d time.Duration) WorldOption {
	return worldOption(func(c *config) { c.timeout = d })
}

// WithChecked turns on checked mode: before each collective (and Send/Recv) the
// ranks compare its sequence number, op, dtype, count and root, and all fail with
// ErrInvalidArgument naming the ranks that differ, instead of aborting or returning
// garbage. It costs one small allgather per collective. Without it, PYBRIDGE_CHECKED=1
// turns it on. Every rank must use the same mode.
func WithChecked() Option { return initOption(func(c *config) { c.checked = true }) }

// WithWatchdog sets how long a collective may be unfinished before the hang watchdog
// reports, to stderr, the ranks that have not reached it. Zero keeps the default
// (PYBRIDGE_WATCHDOG, else min(60 s, timeout/2)); a negative duration turns it off
// (errors then name the operation but not the ranks).
func WithWatchdog(d time.Duration) Option { return initOption(func(c *config) { c.watchdog = d }) }

// Init joins the process group. Whatever the options leave unset comes from
// the launcher's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT, as torchrun and pybridge-launch set them).
//
// Init fails with ErrAlreadyInitialized while another group is live, with
// ErrTimeout when a peer does not join within the timeout (naming the ranks that
// did not), and with ErrInvalidArgument for bad options, a missing environment, or
// ranks that disagree on the world size or checked mode.
func Init(opts ...Option) (*Group, error) { return initWorld(context.Background(), "Init", opts) }

// InitContext is Init under ctx (see Contexts): a ctx that ends while Init waits
// for the store or its peers ends it (pb_init_abort) with ErrCanceled, and no
// group is left behind.
func InitContext(ctx context.Context, opts ...Option) (*Group, error) {
	return initWorld(ctx, "InitContext", opts)
}

func initWorld(ctx context.Context, op string, opts []Option) (*Group, error) {
	c := config{rank: -1, worldSize: -1, localRank: -1}
	for _, o := range opts {
		if o != nil {
			o.applyInit(&c)
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
	method, backend := cStringOrNil(c.initMethod), cStringOrNil(c.backend)
	defer C.free(unsafe.Pointer(method))
	defer C.free(unsafe.Pointer(backend))
	var h *C.pb_group
	var flags C.int32_t
	if c.checked {
		flags |= C.PB_INIT_CHECKED
	}
	watchdog := c.watchdog.Seconds()
	if c.watchdog < 0 {
		watchdog = -1
	}
	err = underContext(ctx, op, joinAborter{}, func() error {
		var msg *C.char
		return check(op, C.pbgo_init_v2(method, backend, rank, size, local, C.double(c.timeout.Seconds()), flags,
			C.double(watchdog), &h, &msg), msg)
	})
	return joined(op, h, err)
}

// joined is the world of a join (Init, ElasticInit, ElasticState.Reset): h as a Group, or
// err; a world formed by a call whose context ended is left (finalized), not returned.
func joined(op string, h *C.pb_group, err error) (*Group, error) {
	if err != nil {
		if h != nil {
			C.pbgo_finalize(h, nil)
		}
		return nil, err
	}
	return newWorld(op, h)
}

// cStringOrNil copies s into C memory (free it with C.free), or is NULL for "": the
// library's default.
func cStringOrNil(s string) *C.char {
	if s == "" {
		return nil
	}
	return C.CString(s)
}

// newWorld describes a world group handle the library just made.
func newWorld(op string, h *C.pb_group) (*Group, error) {
	g, err := describe(op, h, true)
	if err != nil {
		C.pbgo_finalize(h, nil) // a group we cannot describe is of no use
		return nil, err
	}
	refreshObserving() // recording starts with a world (observe.go)
	return g, nil
}

// describe reads a group handle's rank, size, local rank, device and members.
func describe(op string, h *C.pb_group, world bool) (*Group, error) {
	var info [4]C.int32_t
	var msg *C.char
	if err := check(op, C.pbgo_info(h, &info[0], &msg), msg); err != nil {
		return nil, err
	}
	g := &Group{rank: int(info[0]), size: int(info[1]), localRank: int(info[2]),
		device: int(info[3]), ranks: make([]int, int(info[1]))}
	g.h = h
	if world {
		for i := range g.ranks {
			g.ranks[i] = i
		}
		return g, nil
	}
	global := make([]C.int32_t, g.size)
	msg = nil
	if err := check(op, C.pbgo_group_ranks(h, info[1], &global[0], &msg), msg); err != nil {
		return nil, err
	}
	for i, r := range global {
		g.ranks[i] = int(r)
	}
	return g, nil
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
func (g *Group) Barrier() error { return g.barrier(context.Background(), "Barrier") }

// BarrierContext is Barrier under ctx (see Contexts): a ctx that ends while it
// waits aborts g.
func (g *Group) BarrierContext(ctx context.Context) error { return g.barrier(ctx, "BarrierContext") }

func (g *Group) barrier(ctx context.Context, op string) error {
	h, err := g.handle(op)
	if err != nil {
		return err
	}
	return g.run(ctx, op, func() error {
		var msg *C.char
		return check(op, C.pbgo_barrier(h, &msg), msg)
	})
}

// Close leaves the process group (the world), or frees a subgroup. Later calls
// on the group return ErrClosed; closing again returns nil.
func (g *Group) Close() error {
	const op = "Close"
	if g == nil || g.h == nil {
		return nilError(op, "Group")
	}
	return g.close(op, func(h *C.pb_group, msg **C.char) C.int {
		if g.sub {
			return C.pbgo_group_close(h, msg)
		}
		return C.pbgo_finalize(h, msg)
	})
}

// handle returns the C handle. A closed world group keeps passing its handle: the
// library answers PB_ERR_CLOSED for it (and for its subgroups), so that message
// comes from one place. A closed subgroup's handle is unknown to the library: Go
// answers for it.
func (g *Group) handle(op string) (*C.pb_group, error) {
	if g == nil || g.h == nil {
		return nil, nilError(op, "Group")
	}
	if g.sub {
		return g.get(op, "subgroup was closed")
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

// Subgroups
//
// A subgroup is a *Group like the world: every collective, the reducer and the
// loader take one, and ranks passed with it (roots, peers, member lists) are
// ranks within that group, 0 to Size()-1. Close a subgroup when done; closing
// the world closes its subgroups too (their calls then return ErrClosed).

// Split is MPI_Comm_split, a collective over g: every member calls it. Members
// passing the same color form one subgroup, ranked by (key, rank in g). A
// negative color joins no group: Split returns nil, nil.
func (g *Group) Split(color, key int) (*Group, error) {
	return g.split(context.Background(), "Split", color, key, "")
}

// SplitContext is Split under ctx (see Contexts): a ctx that ends while it waits
// aborts g (and the subgroup being made).
func (g *Group) SplitContext(ctx context.Context, color, key int) (*Group, error) {
	return g.split(ctx, "SplitContext", color, key, "")
}

// SplitWithBackend is Split with the subgroup's backend chosen: "gloo", "nccl",
// or "" for g's. The usual use is a gloo group beside an nccl world, for Go
// slices and other host memory (metrics, the loader), as torch's
// new_group(backend="gloo"): host, err := world.SplitWithBackend(0, world.Rank(), "gloo").
func (g *Group) SplitWithBackend(color, key int, backend string) (*Group, error) {
	return g.split(context.Background(), "SplitWithBackend", color, key, backend)
}

// SplitWithBackendContext is SplitWithBackend under ctx, as SplitContext.
func (g *Group) SplitWithBackendContext(ctx context.Context, color, key int, backend string) (*Group, error) {
	return g.split(ctx, "SplitWithBackendContext", color, key, backend)
}

func (g *Group) split(ctx context.Context, op string, color, key int, backend string) (*Group, error) {
	h, err := g.handle(op)
	if err != nil {
		return nil, err
	}
	c, err := toInt32(op, "color", color)
	if err != nil {
		return nil, err
	}
	k, err := toInt32(op, "key", key)
	if err != nil {
		return nil, err
	}
	var cBackend *C.char
	if backend != "" {
		cBackend = C.CString(backend)
		defer C.free(unsafe.Pointer(cBackend))
	}
	var out *C.pb_group
	err = g.run(ctx, op, func() error {
		var msg *C.char
		return check(op, C.pbgo_group_split_backend(h, c, k, cBackend, &out, &msg), msg)
	})
	return g.child(op, out, err)
}

// SetStream orders g's calls on CUDA memory on stream (a cudaStream_t, such as
// gotch's or libtorch's current stream pointer) instead of the calling
// thread's current libtorch stream; nil goes back to the current stream.
// Tensors must be ready in that stream's order when a call is made; a blocking
// call's result is ready in its order when the call returns, an asynchronous
// one's when its Work completes; a Reducer on g copies and reduces on it too.
// A goroutine may move between OS threads, and libtorch's current stream is
// per thread, so a Go program that computes on its own stream should set it
// here rather than rely on the current one. The stream must outlive its use.
// ErrInvalidArgument when stream is not nil and the process has no CUDA.
// Not yet run on a GPU.
func (g *Group) SetStream(stream unsafe.Pointer) error {
	const op = "SetStream"
	h, err := g.handle(op)
	if err != nil {
		return err
	}
	var msg *C.char
	return check(op, C.pbgo_group_set_stream(h, stream, &msg), msg)
}

// Subgroup returns the group of g's members with the given ranks (ranks in g),
// ranked in that order. Every member of g calls it, in the same order as its
// other group creations from g; a rank not listed gets nil, nil at once.
func (g *Group) Subgroup(ranks []int) (*Group, error) {
	return g.subgroup(context.Background(), "Subgroup", ranks)
}

// SubgroupContext is Subgroup under ctx (see Contexts): a ctx that ends while it
// waits for the other members aborts g.
func (g *Group) SubgroupContext(ctx context.Context, ranks []int) (*Group, error) {
	return g.subgroup(ctx, "SubgroupContext", ranks)
}

func (g *Group) subgroup(ctx context.Context, op string, ranks []int) (*Group, error) {
	h, err := g.handle(op)
	if err != nil {
		return nil, err
	}
	n, err := toInt32(op, "rank count", len(ranks))
	if err != nil {
		return nil, err
	}
	cr := make([]C.int32_t, len(ranks)+1) // +1: a valid pointer even for no ranks
	for i, r := range ranks {
		if cr[i], err = toInt32(op, "rank", r); err != nil {
			return nil, err
		}
	}
	var out *C.pb_group
	err = g.run(ctx, op, func() error {
		var msg *C.char
		return check(op, C.pbgo_group_new(h, &cr[0], n, &out, &msg), msg)
	})
	return g.child(op, out, err)
}

// Nodes returns this rank's intra-node group and its cross-node group (the
// members with this local rank on every node). Nodes are consecutive blocks of
// ranksPerNode ranks of g; 0 reads LOCAL_WORLD_SIZE as set by pybridge-launch.
// A collective over g.
func (g *Group) Nodes(ranksPerNode int) (intra, cross *Group, err error) {
	return g.nodes(context.Background(), "Nodes", ranksPerNode)
}

// NodesContext is Nodes under ctx (see Contexts): a ctx that ends while it waits
// aborts g.
func (g *Group) NodesContext(ctx context.Context, ranksPerNode int) (intra, cross *Group, err error) {
	return g.nodes(ctx, "NodesContext", ranksPerNode)
}

func (g *Group) nodes(ctx context.Context, op string, ranksPerNode int) (intra, cross *Group, err error) {
	h, err := g.handle(op)
	if err != nil {
		return nil, nil, err
	}
	per, err := toInt32(op, "ranks per node", ranksPerNode)
	if err != nil {
		return nil, nil, err
	}
	var a, b *C.pb_group
	err = g.run(ctx, op, func() error {
		var msg *C.char
		return check(op, C.pbgo_group_nodes(h, per, &a, &b, &msg), msg)
	})
	if err != nil {
		g.child(op, b, err)
		_, err = g.child(op, a, err)
		return nil, nil, err
	}
	if intra, err = g.child(op, a, nil); err != nil {
		C.pbgo_group_close(b, nil)
		return nil, nil, err
	}
	if cross, err = g.child(op, b, nil); err != nil {
		intra.Close()
		return nil, nil, err
	}
	return intra, cross, nil
}

// Ranks returns the global rank of each member, indexed by rank in g.
func (g *Group) Ranks() []int {
	if g == nil {
		return nil
	}
	return append([]int(nil), g.ranks...)
}

// GlobalRank returns the global rank of member groupRank of g.
func (g *Group) GlobalRank(groupRank int) (int, error) {
	if g == nil || groupRank < 0 || groupRank >= len(g.ranks) {
		return -1, newError(statusInvalidArgument, "GlobalRank", "rank %d is out of range for a group of size %d",
			groupRank, g.Size())
	}
	return g.ranks[groupRank], nil
}

// RankOf returns the rank in g of the process with global rank globalRank.
func (g *Group) RankOf(globalRank int) (int, error) {
	for i, r := range g.Ranks() {
		if r == globalRank {
			return i, nil
		}
	}
	return -1, newError(statusInvalidArgument, "RankOf", "global rank %d is not a member (members: %v)",
		globalRank, g.Ranks())
}

// child wraps a subgroup handle from the library (nil for no group), or returns err
// (the call's), closing h: a subgroup made by a call whose context ended is of no use.
func (g *Group) child(op string, h *C.pb_group, err error) (*Group, error) {
	if err != nil {
		if h != nil {
			C.pbgo_group_close(h, nil)
		}
		return nil, err
	}
	if h == nil {
		return nil, nil
	}
	sub, err := describe(op, h, false)
	if err != nil {
		C.pbgo_group_close(h, nil)
		return nil, err
	}
	sub.sub = true
	return sub, nil
}
