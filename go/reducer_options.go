package pybridge

// The options of NewReducer and AttachReducer: each fills the one pb_reducer_options the
// constructor passes to the library, which pb_reducer_options_init filled with the
// defaults first (the header is the one source of them).

/*
#include "pbgo_reducer.h"
*/
import "C"

import (
	"fmt"
	"math"
	"unsafe"
)

// reducerConfig is what the options fill: the C options struct, and the first value an
// option could not take (the constructor returns it as ErrInvalidArgument).
type reducerConfig struct {
	o        C.pb_reducer_options
	bad      string  // the first bad option value, named by its option
	hookBad  string  // WithCompression's unknown value: a later choice of how buckets travel replaces it
	hookName *string // WithHookName: a hook chosen by name (registry.go), C memory once passed
}

// withCStrings points the struct's strings at C copies for a call (the hook's name),
// and returns what frees them after it.
func (c *reducerConfig) withCStrings() (free func()) {
	c.o.hook_name = nil
	if c.hookName == nil {
		return func() {}
	}
	c.o.hook_name = C.CString(*c.hookName)
	return func() { C.free(unsafe.Pointer(c.o.hook_name)); c.o.hook_name = nil }
}

// newReducerConfig applies opts over pb_reducer_options_init's defaults.
func newReducerConfig(opts []ReducerOption) *reducerConfig {
	c := &reducerConfig{}
	C.pb_reducer_options_init(&c.o)
	for _, o := range opts {
		if o != nil {
			o(c)
		}
	}
	return c
}

// err is the options' first bad value as an error of op, or nil.
func (c *reducerConfig) err(op string) error {
	bad := c.hookBad
	if bad == "" {
		bad = c.bad
	}
	if bad == "" {
		return nil
	}
	return newError(statusInvalidArgument, op, "%s", bad)
}

// int32Of converts an option's int for the C struct (see optionInt32).
func (c *reducerConfig) int32Of(option, what string, v int) C.int32_t {
	return optionInt32(&c.bad, option, what, v)
}

// optionInt32 converts an option's int for a C options struct; a value that does not fit
// is noted in *bad, unless an earlier one is (option names it, what the value), for the
// constructor to return as ErrInvalidArgument.
func optionInt32(bad *string, option, what string, v int) C.int32_t {
	if v < math.MinInt32 || v > math.MaxInt32 {
		if *bad == "" {
			*bad = fmt.Sprintf("%s: %s %d does not fit in 32 bits", option, what, v)
		}
		return 0
	}
	return C.int32_t(v)
}

// ReducerOption configures NewReducer and AttachReducer. Hooks, compression, PowerSGD,
// hierarchical and gossip choose one thing, how buckets travel: the last of them given
// wins.
type ReducerOption func(*reducerConfig)

// WithBucketCapMB sets the bucket size in MiB, the first bucket's too (torch DDP's
// rule). Without it, or with 0, buckets hold 25 MiB and the first 1 MiB, so that
// the first allreduce starts early. A negative or NaN size makes NewReducer fail
// with ErrInvalidArgument (bucket_cap_mb), as Python's Reducer refuses it.
func WithBucketCapMB(mb float64) ReducerOption {
	return func(c *reducerConfig) { c.o.bucket_cap_mb = C.double(mb) }
}

// WithFirstBucketCapMB sets the first bucket's size in MiB apart from the others
// (0: by WithBucketCapMB's rule).
func WithFirstBucketCapMB(mb float64) ReducerOption {
	return func(c *reducerConfig) { c.o.first_bucket_cap_mb = C.double(mb) }
}

// WithReduceOp chooses Avg (the default: gradients are averaged over ranks) or Sum.
func WithReduceOp(op Op) ReducerOption { return func(c *reducerConfig) { c.o.op = C.int32_t(op) } }

// WithAllowUnused lets Wait succeed when some gradients were not marked ready:
// they are reduced with whatever their views hold (Zero them for "no gradient").
func WithAllowUnused() ReducerOption {
	return func(c *reducerConfig) { c.o.flags |= C.PB_REDUCER_ALLOW_UNUSED }
}

// WithoutRebuild keeps the initial bucket layout (reverse parameter order)
// instead of rebuilding it once in the order gradients became ready.
func WithoutRebuild() ReducerOption {
	return func(c *reducerConfig) { c.o.flags |= C.PB_REDUCER_NO_REBUILD }
}

// WithGradAsBucketView (AttachReducer only) makes each parameter's grad a view
// of its place in its bucket, torch DDP's gradient_as_bucket_view: backward
// accumulates straight into the bucket and nothing is copied. A grad the
// optimizer set to nil is made a view again at the next backward.
func WithGradAsBucketView() ReducerOption {
	return func(c *reducerConfig) { c.o.flags |= C.PB_REDUCER_BUCKET_VIEW }
}

// WithJoin lets ranks run different numbers of iterations (see Reducer.Join): each
// iteration then starts with one small allreduce counting the ranks still training
// (at its first MarkReady or Wait), so that a rank whose loader has no more batches
// can call Join and shadow the others until all have joined. Gradients are averaged
// over the world size, as torch's Join does by default: every sample weighs the same.
// Every rank creates its reducer with it, or none does.
func WithJoin() ReducerOption {
	return func(c *reducerConfig) { c.o.flags |= C.PB_REDUCER_JOIN }
}

// WithJoinDivideByActive is WithJoin with gradients averaged over the ranks
// still training instead of the world size (torch's
// divide_by_initial_world_size=False): the last batches of an epoch, reduced
// by fewer ranks, then weigh more.
func WithJoinDivideByActive() ReducerOption {
	return func(c *reducerConfig) { c.o.flags |= C.PB_REDUCER_JOIN | C.PB_REDUCER_JOIN_DIVIDE_BY_ACTIVE }
}

// ---- how buckets travel ----------------------------------------------------------------

// Hook selects how a full bucket travels (pybridge.h's PB_HOOK_*): the reducer
// keeps readiness, order and rebuilds; the hook is torch's DDP comm hook.
type Hook int32

// Built-in communication hooks.
const (
	HookAllReduce Hook = C.PB_HOOK_ALLREDUCE // sum, divided first for Avg (the default)
	HookFP16      Hook = C.PB_HOOK_FP16      // float32 buckets travel as half
	HookBF16      Hook = C.PB_HOOK_BF16      // float32 buckets travel as bfloat16
	HookPowerSGD  Hook = C.PB_HOOK_POWERSGD  // torch's PowerSGD low-rank compression
	// Sum in the node, allreduce among node leaders, broadcast in the node (WithHierarchical).
	HookHierarchical Hook = C.PB_HOOK_HIERARCHICAL
)

// Compression is the wire format of float32 gradient buckets: another name for
// a Hook (CompressFP16 is HookFP16).
type Compression int32

// Gradient compression (PB_COMPRESS_* of pybridge.h, equal to the PB_HOOK_*
// codes of the same hooks). Only float32 buckets are compressed; they are
// decompressed in place after the allreduce.
const (
	NoCompression Compression = C.PB_COMPRESS_NONE
	CompressFP16  Compression = C.PB_COMPRESS_FP16
	CompressBF16  Compression = C.PB_COMPRESS_BF16
)

// WithHook chooses a built-in communication hook (HookPowerSGD with rank 1
// and warm start; WithPowerSGD chooses those). WithHook(HookFP16) and
// WithCompression(CompressFP16) make the same reducer.
func WithHook(h Hook) ReducerOption {
	return func(c *reducerConfig) { c.setHook(h) }
}

// setHook makes h how buckets travel, in place of gossip or an earlier hook (the
// gossip fields go back to pb_reducer_options_init's).
func (c *reducerConfig) setHook(h Hook) {
	var d C.pb_reducer_options
	C.pb_reducer_options_init(&d)
	c.o.hook = C.int32_t(h)
	c.o.gossip_topology, c.o.gossip_ranks_per_node = d.gossip_topology, d.gossip_ranks_per_node
	c.o.gossip_seed, c.o.gossip_sync_every = d.gossip_seed, d.gossip_sync_every
	c.hookBad, c.hookName = "", nil
}

// WithCompression sends float32 buckets as half or bfloat16: the same as
// WithHook(HookFP16) or WithHook(HookBF16).
//
// Deprecated: use WithHook.
func WithCompression(comp Compression) ReducerOption {
	return func(c *reducerConfig) {
		c.setHook(Hook(comp))
		if comp != NoCompression && comp != CompressFP16 && comp != CompressBF16 {
			c.hookBad = fmt.Sprintf("WithCompression: unknown compression %d; "+
				"use NoCompression, CompressFP16 or CompressBF16 (or WithHook)", int32(comp))
		}
	}
}

// WithPowerSGD compresses gradients with torch's PowerSGD: matrices are sent as
// rank-`rank` factors (1 to 4 are typical), with error feedback; the first two
// iterations run plain allreduce. warmStart reuses the last step's factors.
// Give matrix gradients their shape (ParamSpec.Shape): vectors travel
// uncompressed.
func WithPowerSGD(rank int, warmStart bool) ReducerOption {
	return func(c *reducerConfig) {
		c.setHook(HookPowerSGD)
		c.o.hook_rank = c.int32Of("WithPowerSGD", "rank", rank)
		c.o.hook_flags &^= C.PB_HOOK_NO_WARM_START
		if !warmStart {
			c.o.hook_flags |= C.PB_HOOK_NO_WARM_START
		}
	}
}

// WithPowerSGDStartIter sets how many iterations run plain allreduce before
// PowerSGD compresses (torch's start_powerSGD_iter; at least 2, the default).
// Other hooks ignore it.
func WithPowerSGDStartIter(iterations int) ReducerOption {
	return func(c *reducerConfig) {
		c.o.hook_start_iter = c.int32Of("WithPowerSGDStartIter", "start iteration", iterations)
	}
}

// WithHierarchical reduces each bucket in three steps: a sum within the node
// (ranksPerNode consecutive ranks; 0: the launcher's LOCAL_WORLD_SIZE, as
// pybridge-launch and torchrun set it), an allreduce among the node leaders
// (local rank 0 of each node), a broadcast within the node. The result is the
// plain allreduce's (up to the order floats are added in), but only one bucket
// per node crosses node links instead of one per rank. NewReducer is then a
// collective that also creates the node groups; ranks that give another node
// size get ErrInvalidArgument.
func WithHierarchical(ranksPerNode int) ReducerOption {
	return func(c *reducerConfig) {
		c.setHook(HookHierarchical)
		c.o.hook_ranks_per_node = c.int32Of("WithHierarchical", "ranks per node", ranksPerNode)
	}
}

// WithHierarchicalCompression sends WithHierarchical's float32 buckets as half
// (CompressFP16) or bfloat16 (CompressBF16) through all three steps. Other hooks
// refuse it (use WithHook(HookFP16) for a plain allreduce on a half wire).
func WithHierarchicalCompression(comp Compression) ReducerOption {
	return func(c *reducerConfig) {
		c.o.hook_flags &^= C.PB_HOOK_WIRE_FP16 | C.PB_HOOK_WIRE_BF16
		switch comp {
		case NoCompression:
		case CompressFP16:
			c.o.hook_flags |= C.PB_HOOK_WIRE_FP16
		case CompressBF16:
			c.o.hook_flags |= C.PB_HOOK_WIRE_BF16
		default:
			if c.bad == "" {
				c.bad = fmt.Sprintf("WithHierarchicalCompression: unknown compression %d; "+
					"use NoCompression, CompressFP16 or CompressBF16", int32(comp))
			}
		}
	}
}

// GossipTopology chooses GossipGraD's partners (pybridge.h's PB_GOSSIP_*).
type GossipTopology int32

// Gossip topologies: see WithGossip.
const (
	GossipCube          GossipTopology = C.PB_GOSSIP_CUBE          // pairs i XOR 2^k
	GossipDissemination GossipTopology = C.PB_GOSSIP_DISSEMINATION // send i+2^k, receive i-2^k
)

// WithGossip replaces the allreduce with GossipGraD: each node (ranksPerNode
// consecutive ranks; 0: the launcher's ranks per node, LOCAL_WORLD_SIZE, or 1
// without a launcher) averages within itself and exchanges with one partner node
// per step, partners rotating from seed. Communication per step no longer grows
// with the world, but replicas drift apart: every syncEvery-th step (0: never)
// the gradients are averaged exactly, and the program should average its
// parameters there (AllReduce with Avg). NewReducer is then a collective that
// also creates the node groups.
func WithGossip(topology GossipTopology, ranksPerNode int, seed int64, syncEvery int) ReducerOption {
	return func(c *reducerConfig) {
		c.setHook(HookAllReduce)
		c.o.gossip_topology = C.int32_t(topology)
		c.o.gossip_ranks_per_node = c.int32Of("WithGossip", "ranks per node", ranksPerNode)
		c.o.gossip_seed = C.int64_t(seed)
		c.o.gossip_sync_every = c.int32Of("WithGossip", "sync every", syncEvery)
	}
}
