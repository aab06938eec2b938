"""How a fusion method declares itself (its options, defaults, validation, data needs) and how options are checked.

Each method module builds one `FusionMethod` (ot.py builds three) from its merge function and its
`Option`s; the registry in fusion/__init__.py is built from those declarations. A method's merge is
called through `FusionMethod.merge`, which checks every option against its declaration (an unknown
or badly typed option is a one-line SymfusionError naming it), fills in the defaults and resolves
per-family values before the maths runs.

Per-family values. Any option may be given as one value or as a mapping from model family
(families.FAMILIES, i.e. config.model_type) to value, with an optional `default` entry for the other
families: `normalize: {vit: param, default: none}`. The references ran the ViT experiments and the
language experiments with different settings; each Option's default states both this way, so the
same declaration serves the vision and the language merges (presets/fusion/<name>.yaml adds only what the
merge stage reads itself: num_batches).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from symfusion.families import FAMILIES
from symfusion.errors import SymfusionError
from symfusion.fusion.common import batches_of

# Keys of presets/fusion/<name>.yaml that the merge stage reads itself: never passed to the method.
STAGE_KEYS = ("name", "num_batches")

_KIND_NAMES = {float: "a number", int: "an integer", bool: "true or false", str: "a string", list: "a list of strings"}


@dataclass(frozen=True)
class Option:
    """One option of a fusion method: name, default, type and accepted values, and what it means."""

    name: str
    default: Any
    help: str
    kind: type = float                  # float (ints accepted), int, bool, str or list (of str)
    choices: tuple = ()                 # the accepted values, if only some are
    valid: Callable[[Any], bool] | None = None
    rule: str = ""                      # what `valid` demands, for the error line ("> 0", "in [0, 1]")
    nullable: bool = False              # null (None) is accepted and means what `help` says

    def describe(self) -> str:
        """What a value must be, as the error line says it."""
        if self.choices:
            text = "one of " + ", ".join(str(c) for c in self.choices)
        else:
            text = _KIND_NAMES[self.kind] + (f" {self.rule}" if self.rule else "")
        return text + (" or null" if self.nullable else "")

    def check(self, value: Any, method: str) -> Any:
        """The value if it is acceptable (ints become floats for float options); raises naming the option."""
        if value is None and self.nullable:
            return None
        if not self._typed(value) or (self.choices and value not in self.choices) or \
                (self.valid is not None and not self.valid(value)):
            raise SymfusionError(f"{method}: option {self.name} must be {self.describe()}, got {value!r}")
        return float(value) if self.kind is float else (list(value) if self.kind is list else value)

    def _typed(self, value: Any) -> bool:
        if isinstance(value, bool):
            return self.kind is bool
        if self.kind is float:
            return isinstance(value, (int, float))
        if self.kind is list:
            return isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
        return isinstance(value, self.kind)


@dataclass(frozen=True)
class FusionMethod:
    """A fusion method: `fuse(models, batches, **options)` with every declared option resolved.

    A method whose data enters through one statistic per model (Fisher: F_i; RegMean: G_i) declares it:
    `statistic(model, batches, **statistic options)` computes model i's from its own batches, and
    `fuse(models, statistics, **other options)` combines them. Such a statistic can then be computed
    once for a model and given to every merge that fuses it unmoved (stages/statistics.py).
    """

    name: str
    fuse: Callable[..., dict]
    summary: str
    options: tuple[Option, ...] = ()
    label: str = ""                     # its display name in tables and figures ("RegMean"); required
    reads_data: bool = False            # needs statistic batches (the stage loads fusion.num_batches of them)
    statistic: Callable[..., dict] | None = None   # one model's statistic from its batches (tensors by name)
    statistic_options: tuple[str, ...] = ()        # the options `statistic` takes; `fuse` gets the others
    _by_name: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if not self.label.strip():       # a method without a display name would drop out of the report's tables
            raise SymfusionError(f"fusion method {self.name!r} declares no label; give FusionMethod(..., label=...)")
        object.__setattr__(self, "_by_name", {o.name: o for o in self.options})

    def defaults(self) -> dict:
        return {o.name: o.default for o in self.options}

    def examples(self, config: Mapping[str, Any], family: str | None) -> int | None:
        """Statistic examples per model the method reads with a fusion config (its stage keys ignored):
        0 for a method without data, None for every example it is given (num_examples null or absent)."""
        if not self.reads_data:
            return 0
        return self.resolve({k: v for k, v in config.items() if k not in STAGE_KEYS}, family).get("num_examples")

    def merge(self, models: list, batches: list | None = None, statistics: list | None = None, **options) -> dict:
        """Fuse `models` (anchor first): options checked and resolved for the models' family, then `fuse`.

        `statistics` (methods with a `statistic` only): one entry per model, its precomputed statistic
        (`model_statistic` with the same options and batches) or None to compute it here."""
        if len(models) < 2:
            raise SymfusionError(f"fusion needs at least two models, got {len(models)}")
        values = self.resolve(options, family_of_models(models))
        given = list(statistics) if statistics is not None else [None] * len(models)
        if self.statistic is None and statistics is not None:
            raise SymfusionError(f"fusion method {self.name!r} takes no precomputed statistics")
        if len(given) != len(models):
            raise SymfusionError(f"{len(given)} statistics for {len(models)} models: give one (or None) per model")
        if self.reads_data and not batches and any(s is None for s in given):
            raise SymfusionError(f"fusion method {self.name!r} needs data batches (set fusion.num_batches > 0)")
        if self.statistic is None:
            return self.fuse(models, batches, **values)
        own = {k: v for k, v in values.items() if k in self.statistic_options}
        computed = [s if s is not None else self.statistic(m, batches_of(batches, i), **own)
                    for i, (m, s) in enumerate(zip(models, given))]
        return self.fuse(models, computed, **{k: v for k, v in values.items() if k not in self.statistic_options})

    def model_statistic(self, model, batches: list, **options) -> dict:
        """The statistic a merge with these options computes for `model` from `batches` (its own)."""
        if self.statistic is None:
            raise SymfusionError(f"fusion method {self.name!r} has no per-model statistic")
        if not batches:
            raise SymfusionError(f"fusion method {self.name!r} needs data batches (set fusion.num_batches > 0)")
        return self.statistic(model, batches, **self.statistic_settings(options, family_of_models([model])))

    def statistic_settings(self, options: Mapping[str, Any], family: str | None) -> dict:
        """The resolved options the statistic depends on (what identifies a precomputed one, with its data)."""
        values = self.resolve(options, family)
        return {k: v for k, v in values.items() if k in self.statistic_options}

    def resolve(self, options: Mapping[str, Any], family: str | None) -> dict:
        """Every declared option's value for `family` (defaults filled in), each checked."""
        self.check_names(options)
        values = {}
        for option in self.options:
            value = options.get(option.name, option.default)
            values[option.name] = option.check(self._for_family(option, value, family), self.name)
        return values

    def check_names(self, options: Mapping[str, Any]) -> None:
        unknown = sorted(set(options) - set(self._by_name))
        if unknown:
            known = ", ".join(self._by_name) or "none"
            raise SymfusionError(f"fusion method {self.name!r} has no option {unknown[0]}; its options are {known}")

    def check_values(self, options: Mapping[str, Any]) -> None:
        """Check options as a config gives them: names, and every value (each per-family value too)."""
        self.check_names(options)
        for name, value in options.items():
            option = self._by_name[name]
            for one in (self._per_family(option, value).values() if isinstance(value, Mapping) else [value]):
                option.check(one, self.name)

    def _for_family(self, option: Option, value: Any, family: str | None) -> Any:
        """A plain value, or the entry of a per-family mapping for `family` (else its 'default')."""
        if not isinstance(value, Mapping):
            return value
        values = self._per_family(option, value)
        if family in values:
            return values[family]
        if "default" in values:
            return values["default"]
        raise SymfusionError(f"{self.name}: option {option.name} gives no value for family {family} "
                             f"(add it, or a 'default' entry)")

    def _per_family(self, option: Option, values: Mapping) -> Mapping:
        unknown = sorted(set(values) - set(FAMILIES) - {"default"})
        if unknown:
            raise SymfusionError(f"{self.name}: option {option.name} names unknown family {unknown[0]!r}; "
                                 f"use {', '.join(FAMILIES)} or default")
        return values


def family_of_models(models: list) -> str | None:
    """The anchor's config.model_type (None for a model without a config, e.g. a plain nn.Module)."""
    return getattr(getattr(models[0], "config", None), "model_type", None)


def check_config(method: FusionMethod, config: Mapping[str, Any]) -> None:
    """Check presets/fusion/<name>.yaml (after overrides) against the declaration: its name, the stage's
    num_batches (data methods only, an integer >= 1) and every option; raises naming the first bad key."""
    if config.get("name") != method.name:
        raise SymfusionError(f"fusion config for {method.name!r} says name: {config.get('name')!r}")
    if "num_batches" in config:
        count = config["num_batches"]
        if not method.reads_data:
            raise SymfusionError(f"{method.name}: reads no data, so it takes no num_batches")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise SymfusionError(f"{method.name}: num_batches must be an integer >= 1, got {count!r}")
    method.check_values({k: v for k, v in config.items() if k not in STAGE_KEYS})
