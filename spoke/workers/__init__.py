"""Reader workers: more processes answering cache hits on the spoke's port (``--workers``)."""
