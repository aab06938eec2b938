"""Model folders on disk, storage only: resolving their files, strict loading and saving, safe outputs and the marked bookkeeping files beside them (nothing here imports matching/)."""
