"""Fast tests of pure parts, one component each: the format, the read-ahead policy, the thread
offload, the layering and size budget, bench's pure helpers. No mount, no server, no subprocess
but the layering's import checks."""
