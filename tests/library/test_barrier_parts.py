"""benchmarks/bench_barrier_parts.py's parts: every floating tensor of a model in exactly one part, a layer's parts
holding that layer's tensors only, for every encoder and decoder layout (GPT-2's fused maps as canonical views)."""
import pytest

from symfusion.arch import layout_of
from symfusion.matching.pairs import layer_prefix
from benchmark_scripts import load_benchmark
from tiny_decoders import DECODER_IDS, DECODERS, tiny_decoder
from tiny_models import VARIANT_IDS, VARIANTS, tiny_model

MODELS = [("encoder", f, o) for f, o in VARIANTS] + [("decoder", f, o) for f, o in DECODERS]


@pytest.mark.parametrize("kind, family, overrides", MODELS, ids=VARIANT_IDS + DECODER_IDS)
def test_parts_place_every_tensor_once_and_a_layer_s_parts_hold_its_own(kind, family, overrides):
    model = tiny_model(family, **overrides) if kind == "encoder" else tiny_decoder(family, **overrides)
    state = model.state_dict()
    layout = layout_of(model.config, state)
    canonical = layout.canonical(state)
    floating = [k for k, v in canonical.items() if v.is_floating_point()]
    parts = load_benchmark("bench_barrier_parts").parts(layout, floating)
    placed = [k for keys in parts.values() for k in keys]
    assert sorted(placed) == sorted(floating)                      # each exactly once
    for i in range(layout.num_layers):
        mine = [k for name, keys in parts.items() if name.startswith(f"layer {i} ") for k in keys]
        assert mine and all(k.startswith(layer_prefix(layout, i)) for k in mine)
    outside = [k for name, keys in parts.items() if not name.startswith("layer ") for k in keys]
    assert not any(k.startswith(layer_prefix(layout, i)) for k in outside for i in range(layout.num_layers))
