"""How gradients travel and models are averaged: torch's DDP comm-hook contract and the
built-in hooks (allreduce, fp16/bf16, PowerSGD, gossip, hierarchical), periodic model
averaging (local SGD), and DiLoCo / Streaming DiLoCo with their quantized average. Above
the communication core, below the reducer."""
