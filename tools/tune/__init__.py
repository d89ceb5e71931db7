"""``tools tune``: choose instances, threads and batching by measurement against the live server.

Each trial repackages the spec with some knobs changed, serves it and loads it against P99.
"""
