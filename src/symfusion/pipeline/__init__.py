"""The pipeline above the library: data sources, task objects, stages, the report, and their plumbing (warm worker, allocator, pinned revisions, training loop)."""
