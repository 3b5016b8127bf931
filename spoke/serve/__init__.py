"""The spoke's HTTP front: handlers, object reads, the fast path, plain reads, /stats, /metrics."""
