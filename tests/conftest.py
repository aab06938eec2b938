"""pytest setup: tests run offline, single-threaded enough to be repeatable."""
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402

# Tiny models on a busy 2-core machine run many times faster on one thread; results do not depend on it.
torch.set_num_threads(1)
