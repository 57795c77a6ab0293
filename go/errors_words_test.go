package pybridge

import "testing"

// goWords: the leading C function goes, C names of goNames become Go's, the rest stays.
func TestGoWords(t *testing.T) {
	for in, want := range map[string]string{
		"pb_init: process group is already initialized; call pb_finalize first":                       "process group is already initialized; call Group.Close first",
		"pb_reducer_join: pb_reducer_join needs a reducer created with PB_REDUCER_JOIN on every rank": "Reducer.Join needs a reducer created with WithJoin on every rank",
		"pb_all_reduce: op avg needs a floating-point dtype, got PB_INT32; use sum and divide":        "op avg needs a floating-point dtype, got int32; use sum and divide",
		"pb_reducer_create: pb_reducer_options.size is 2 (PB_HOOK_WIRE_* too)":                        "pb_reducer_options.size is 2 (PB_HOOK_WIRE_* too)",
		"rank 1: xpb_init and PB_FLOAT16s stay, PB_FLOAT16 goes":                                      "rank 1: xpb_init and PB_FLOAT16s stay, Float16 goes",
		"pb_state_reset after PB_ERR_MEMBERSHIP; not a live pb_reducer handle":                        "ElasticState.Reset after ErrMembership; not a live Reducer handle",
		"pb_reducer_create: first_bucket_cap_mb must be a positive finite number of MiB, got nan":     "WithFirstBucketCapMB must be a positive finite number of MiB, got nan",
		"": "",
	} {
		if got := goWords(in); got != want {
			t.Errorf("goWords(%q) = %q, want %q", in, got, want)
		}
	}
}
