"""A regional tier of spokes: membership, placement of chunks on their owners, and the peer
Upstream that fetches a chunk from its owner (or the hub) on a miss."""
