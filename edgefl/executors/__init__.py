"""Executors: where a round's clients train (in this process, or on Ray workers); above the methods."""
