"""Scenario configuration: TOML files and --set overrides, validated once into frozen objects."""

from fl_sim.config.load import ConfigError, apply_overrides, load_scenario, parse_scenario
from fl_sim.config.schema import AuditSpec, ClientSpec, ModelSpec, ResourcesSpec, Scenario
from fl_sim.data.spec import DataSpec
from fl_sim.executors.cluster import ClusterSpec

__all__ = [
    "AuditSpec",
    "ClientSpec",
    "ClusterSpec",
    "ConfigError",
    "DataSpec",
    "ModelSpec",
    "ResourcesSpec",
    "Scenario",
    "apply_overrides",
    "load_scenario",
    "parse_scenario",
]
