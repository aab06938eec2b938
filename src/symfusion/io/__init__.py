"""Model folders on disk: resolving their files, strict loading and saving, layer-by-layer matching of sharded folders, safe outputs and the marked bookkeeping files beside them."""
