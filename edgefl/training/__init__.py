"""A client's real local training (Madry et al.'s PGD-AT loop, one client or a group at once), its
objectives and the memory allocator; edgefl.executors decides where it runs (in-process or Ray)."""
