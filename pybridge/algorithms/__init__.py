"""How gradients travel and models are averaged: torch's DDP comm-hook contract and the
built-in hooks (allreduce, fp16/bf16, PowerSGD, gossip, hierarchical), and periodic model
averaging (local SGD). Above the communication core, below the reducer."""
