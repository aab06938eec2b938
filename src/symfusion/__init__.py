"""symfusion: symmetry-based parameter matching and model fusion for transformers."""
import importlib

__version__ = "0.1.0"


def __getattr__(name: str):
    """symfusion.align (api.align) and symfusion.align_many (many.align_many) are imported on first use, so that the
    command-line stages start fast."""
    if name == "align":
        return importlib.import_module("symfusion.alignment.api").align
    if name == "align_many":
        return importlib.import_module("symfusion.many").align_many
    raise AttributeError(f"module 'symfusion' has no attribute {name!r}")
