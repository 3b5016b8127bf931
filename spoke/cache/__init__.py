"""The spoke's cache engine: chunks on local disk, verified, published once, evicted by policy.

The engine (:mod:`spoke.cache.engine`) is a facade over units that each do one job and can be
built without a socket: the store, the index, the resident set, space accounting, manifests,
fills and single-flight. It reads from an upstream (:mod:`spoke.upstream`) and knows nothing of
HTTP.
"""
