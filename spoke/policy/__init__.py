"""Eviction policies: ordering hooks over one contract, sized in bytes, standard library only."""
