"""World and ranks, collectives, DDP / FSDP2 wrapping, DCP checkpoints, the host-memory trim: the lowest layer that knows about more than one process."""
