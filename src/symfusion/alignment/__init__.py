"""Aligning one model onto another, in memory or streamed over folders: symfusion.align() and the matching it drives layer by layer over model folders (above matching/, beside many.align_many)."""
