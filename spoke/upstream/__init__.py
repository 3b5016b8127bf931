"""Where the spoke's chunks come from: the hub today; peers and object stores by the same seam."""
