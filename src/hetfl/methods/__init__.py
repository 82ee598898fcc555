"""The method registry: name -> class, with a one-line summary each (``hetfl methods``), and the
resolution of option values (a TOML file, flags, a run's config.json) against the method they name."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..config import Config
from ..data.text import is_text
from ..errors import HetflError
from ..options import option_fields, recorded
from .alllarge import AllLarge
from .allsmall import AllSmall
from .base import Method
from .decoupled import Decoupled
from .depthfl import DepthFL, DepthFLFedAvg
from .exclusivefl import ExclusiveFL
from .fedepth import FeDepth, MFeDepth
from .feddf import FedDF
from .fedrolex import FedRolex
from .fjord import FjORD
from .heterofl import HeteroFL, SHeteroFL
from .inclusivefl import InclusiveFL, InclusiveFLWithoutMD
from .reefl import ReeFL, ReeFLWithoutKD
from .scalefl import ScaleFL
from .splitmix import SplitMix

METHODS: dict[str, type[Method]] = {m.name: m for m in (
    AllLarge, AllSmall, ExclusiveFL, Decoupled, DepthFL, DepthFLFedAvg, InclusiveFL, InclusiveFLWithoutMD, HeteroFL,
    SHeteroFL, FjORD, FedRolex, FedDF, ScaleFL, FeDepth, MFeDepth, SplitMix, ReeFL, ReeFLWithoutKD)}


def method_class(name: str) -> type[Method]:
    """The class of the method called ``name``."""
    try:
        return METHODS[name]
    except KeyError:
        raise HetflError(f"method '{name}' is unknown; choose one of: {', '.join(METHODS)}") from None


def option_owners() -> dict[str, list[str]]:
    """Every method option's name -> the methods that declare it."""
    owners: dict[str, list[str]] = {}
    for name, cls in METHODS.items():
        for option in option_fields(cls.Options):
            owners.setdefault(option, []).append(name)
    return owners


def config_from(values: dict[str, Any], source: str = "config", resolved: bool = False) -> Config:
    """The config of ``values`` (generic options and the named method's own): the values given, over the
    method's defaults, over the options' defaults (a text dataset's model: minilm); every value checked.
    Another method's option is an error. ``resolved``: ``values`` are a resolved config as a run folder records it
    (config.json), where a method option added later and absent is at its field's default (``options.recorded``),
    not at the method's: a run made before the option existed, or with it at that default, reads as it ran."""
    cls = method_class(str(values.get("method", Config.__dataclass_fields__["method"].default)))
    own = option_fields(cls.Options)
    defaults = {k: v for k, v in cls.defaults.items()
                if not (resolved and k in own and own[k].metadata.get("added_later"))}
    for key, methods in option_owners().items():
        if key in values and key not in own:
            raise HetflError(f"{source}: {key} is an option of {', '.join(methods)}; method '{cls.name}' does not "
                             f"use it; drop it")
    if "model" not in values and is_text(values.get("dataset")):  # text needs the pretrained encoder
        values = {**values, "model": "minilm"}
    if _asks_for_privacy(values) and "aggregation_weights" not in values:  # DP averages uniformly (``privacy``)
        defaults = {**defaults, "aggregation_weights": "uniform"}
    cfg = Config.from_dict({**defaults, **values}, source, options=cls.Options)
    # the resolved config records them all (but options added later only when set)
    return cfg.replace(method_options=recorded(asdict(cls.options_of(cfg)), cls.Options))


def _asks_for_privacy(values: dict[str, Any]) -> bool:
    """Whether option ``values`` ask for differential privacy (checked as numbers later: here only whether given)."""
    def given(value) -> bool:
        try:
            return float(value) != 0
        except (TypeError, ValueError):
            return value is not None  # not a number: refused with its name when the config is read

    return given(values.get("dp_noise_multiplier")) or given(values.get("dp_target_epsilon"))


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> Config:
    """The config of a TOML file (or of the config.json a run folder holds: a resolved config) with ``overrides``
    on top."""
    return config_from({**Config.read(path), **(overrides or {})}, source=str(path),
                       resolved=Path(path).suffix == ".json")


def build_method(cfg, input_shape: tuple[int, ...], num_classes: int, device="cpu", who=None) -> Method:
    """The configured method on its backbone, levels fitted to physical budgets when ``cfg.budget`` asks.

    ``who(level)`` names the devices of a level in a budget error (default "level l").
    """
    cls = method_class(cfg.method)
    method = cls(cfg, cls.make_family(cfg, input_shape, num_classes), cfg.levels, device)
    if cfg.budget != "level":
        method.fit_budgets(who)
    return method


__all__ = ["METHODS", "Method", "build_method", "config_from", "load_config", "method_class", "option_owners"]
