"""Each fusion method declares its options: the registry is built from them, presets/fusion/*.yaml is checked
against them, and an unknown or badly typed option is a one-line error naming it."""
import pytest
import torch
from omegaconf import OmegaConf

from symfusion.errors import SymfusionError
from symfusion.fusion import DATA_METHODS, FUSION_METHODS, check_fusion_config, fusion_method, merge_models
from symfusion.fusion import fisher, ot, regmean, simple
from symfusion.fusion.common import first_examples
from symfusion.fusion.options import FusionMethod, Option
from symfusion.presets import PRESETS_DIR
from tiny_models import tiny_model

CONF = PRESETS_DIR / "fusion"


def conf(name):
    return OmegaConf.to_container(OmegaConf.load(CONF / f"{name}.yaml"), resolve=True)


def test_the_registry_is_built_from_the_modules_declarations():
    declared = [simple.METHOD, fisher.METHOD, regmean.METHOD, *ot.METHODS]
    assert list(FUSION_METHODS.values()) == declared
    assert DATA_METHODS == tuple(m.name for m in declared if m.reads_data) == ("fisher", "regmean", "ot_acts",
                                                                                "ot_acts_emd")


@pytest.mark.parametrize("name", list(FUSION_METHODS))
def test_every_preset_is_valid_and_leaves_the_values_to_the_declaration(name):
    """presets/fusion/<name>.yaml: its name and (data methods) the batches the merge stage loads, no option value
    (the declaration is the one place of each)."""
    config = conf(name)
    method = check_fusion_config(config)
    assert method is FUSION_METHODS[name]
    assert set(config) == {"name"} | ({"num_batches"} if method.reads_data else set())
    assert (CONF / f"{name}.yaml").read_text().startswith("# ")        # one comment: where the values live


def test_every_conf_file_has_a_method():
    assert sorted(p.stem for p in CONF.glob("*.yaml")) == sorted(FUSION_METHODS)


@pytest.mark.parametrize("config,message", [
    ({"name": "regmean", "alpha": "high"}, "regmean: option alpha must be a number in [0, 1], got 'high'"),
    ({"name": "regmean", "alpha": {"vit": 0.0, "default": 2.0}}, "regmean: option alpha must be a number in [0, 1], got 2.0"),
    ({"name": "regmean", "alpha": {"opt": 0.5}}, "regmean: option alpha names unknown family 'opt'"),
    ({"name": "fisher", "normalise": "param"}, "fusion method 'fisher' has no option normalise; its options are num_examples,"),
    ({"name": "fisher", "num_examples": 0}, "fisher: option num_examples must be an integer >= 1 or null, got 0"),
    ({"name": "fisher", "chunk_size": True}, "fisher: option chunk_size must be an integer >= 1, got True"),
    ({"name": "fisher", "plain_average": "classifier"}, "fisher: option plain_average must be a list of strings"),
    ({"name": "ot_acts", "tokens": "window"}, "ot_acts: option tokens must be a string all, only_cls or window_<k>"),
    ({"name": "ot_wts", "num_batches": 4}, "ot_wts: reads no data, so it takes no num_batches"),
    ({"name": "fisher", "num_batches": 0}, "fisher: num_batches must be an integer >= 1, got 0"),
    ({"name": "average"}, "unknown fusion method 'average'; choose one of simple, fisher"),
])
def test_bad_configs_are_one_line_errors_naming_the_key(config, message):
    with pytest.raises(SymfusionError) as error:
        check_fusion_config(config)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_per_family_values_resolve_for_the_models_family():
    method = fusion_method("regmean")
    values = {"alpha": {"vit": 0.0, "default": 0.1}}
    assert method.resolve(values, "vit")["alpha"] == 0.0
    assert method.resolve(values, "bert")["alpha"] == 0.1
    assert method.resolve({"alpha": 0.9}, "vit")["alpha"] == 0.9                       # a plain value: every family
    assert method.resolve({}, None)["anchor_keys"] == []                                 # no config: the default entry
    with pytest.raises(SymfusionError, match="option alpha gives no value for family bert"):
        method.resolve({"alpha": {"vit": 0.0}}, "bert")


def test_methods_say_how_many_statistic_examples_they_read():
    """What the merge stage must load per model: the references' counts for ViTs, whatever it gives text models."""
    counts = {name: (m.examples(conf(name), "vit"), m.examples(conf(name), "bert")) for name, m in FUSION_METHODS.items()}
    assert counts == {"simple": (0, 0), "fisher": (1000, None), "regmean": (1000, None), "ot_acts": (200, None),
                      "ot_acts_emd": (200, None), "ot_wts": (0, 0)}
    assert fusion_method("fisher").examples({"num_examples": 16}, "vit") == 16


def test_merge_models_takes_options_as_keywords_and_checks_them():
    models = [tiny_model("vit", seed=s) for s in (1, 2)]
    batches = [{"pixel_values": torch.randn(3, 3, 8, 8), "labels": torch.tensor([0, 1, 2])}]
    by_name = merge_models("regmean", models, batches, alpha={"vit": 0.5, "default": 0.1}, anchor_keys=[])
    torch.testing.assert_close(by_name, regmean.merge(models, batches, alpha=0.5, anchor_keys=[]))
    with pytest.raises(SymfusionError, match="fusion method 'simple' has no option alpha; its options are none"):
        merge_models("simple", models, None, alpha=0.5)
    with pytest.raises(SymfusionError, match="at least two models"):
        merge_models("simple", models[:1])


def test_a_new_method_declares_its_options():
    def fuse(models, batches, weight):
        return {"w": weight}
    method = FusionMethod("toy", fuse, "a toy", label="Toy", options=(Option("weight", 0.5, "w", valid=lambda v: v >= 0, rule=">= 0"),))
    models = [torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)]
    assert method.merge(models) == {"w": 0.5} and method.merge(models, weight=2) == {"w": 2.0}
    with pytest.raises(SymfusionError, match="toy: option weight must be a number >= 0, got -1"):
        method.merge(models, weight=-1)


def test_first_examples_cuts_batches_at_the_limit():
    batches = [{"x": torch.arange(4), "labels": torch.arange(4), "flag": 1}, {"x": torch.arange(4, 8), "labels": torch.arange(4)}]
    kept = first_examples(batches, 6)
    assert [b["x"].tolist() for b in kept] == [[0, 1, 2, 3], [4, 5]] and kept[0]["flag"] == 1
    assert first_examples(batches, None) == batches and len(first_examples(batches, 100)) == 2
