"""The pipeline's stages, one module each (data, train, match, merge, evaluate, barrier, layers, multimodel),
above the library: each reads model folders and task objects and writes one result (folder or JSON)."""
