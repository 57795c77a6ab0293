"""A training job's life beyond one step: checkpoints, elastic training (state kept in
memory, worlds re-formed when members come and go) and its membership protocol."""
