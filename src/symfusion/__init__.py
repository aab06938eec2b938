"""symfusion: symmetry-based parameter matching and model fusion for transformers."""

__version__ = "0.1.0"
