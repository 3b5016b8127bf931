"""Fetching before loaders ask: read-ahead of sequential streams, warm jobs, and loaders' plans."""
