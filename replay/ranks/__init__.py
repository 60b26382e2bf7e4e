"""Recordings that span the ranks of a torch.distributed program: one snapshot a rank under a parent."""
