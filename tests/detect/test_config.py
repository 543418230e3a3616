"""The versioned YAML config: defaults, overrides, and rejection of bad input."""

from __future__ import annotations

import dataclasses

import pytest

from slurm_tpu.config import Config, load_config, parse_config
from slurm_tpu.errors import ConfigError


def test_missing_default_file_means_defaults(monkeypatch, tmp_path):
    monkeypatch.delenv("SLURM_TPU_CONFIG", raising=False)
    monkeypatch.setattr("slurm_tpu.config.DEFAULT_PATH", str(tmp_path / "absent.yaml"))
    assert load_config() == Config()


def test_full_config_round_trip(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "version: 1\nnode_name: n7\n"
        "gres: {tpu_name: coral, gpu_name: gpu, tpu_types: {usb: u, pci: p}, gpu_types: {a100_sxm4_80gb: a100}}\n"
        "features: {tpu: [tpu], gpu: [gpu, cuda]}\n"
        "devices: {slot_dir: /dev/x, idle: {owner: root, group: adm, mode: '0640'}, lease: {mode: '0660'},"
        " isolate_gpus: true}\n"
        "state_dir: /run/x\nudev: {run_program: /usr/bin/slurm-tpu}\n"
    )
    config = load_config(str(path))
    tpu, gpu = config.family("edgetpu"), config.family("gpu")
    assert config.node_name == "n7" and tpu.gres_name == "coral"
    assert tpu.types == {"usb": "u", "pci": "p"} and gpu.types == {"a100_sxm4_80gb": "a100"}
    assert gpu.features == ("gpu", "cuda") and tpu.features == ("tpu",)
    assert config.idle.group == "adm" and config.idle.mode == 0o640 and config.lease_mode == 0o660
    assert gpu.lease and tpu.lease and config.state_dir == "/run/x" and config.slot_dir == "/dev/x"
    # The same settings in version 2, nested by family, mean exactly the same.
    nested = tmp_path / "v2.yaml"
    nested.write_text(
        "version: 2\nnode_name: n7\n"
        "families:\n"
        "  edgetpu: {gres_name: coral, types: {usb: u, pci: p}, features: [tpu]}\n"
        "  gpu: {gres_name: gpu, types: {a100_sxm4_80gb: a100}, features: [gpu, cuda], isolate: true}\n"
        "devices: {slot_dir: /dev/x, idle: {owner: root, group: adm, mode: '0640'}, lease: {mode: '0660'}}\n"
        "state_dir: /run/x\nudev: {run_program: /usr/bin/slurm-tpu}\n"
    )
    assert load_config(str(nested)) == dataclasses.replace(config, path=str(nested))


def test_env_var_names_the_file(monkeypatch, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("version: 1\nnode_name: from-env\n")
    monkeypatch.setenv("SLURM_TPU_CONFIG", str(path))
    assert load_config().node_name == "from-env"


@pytest.mark.parametrize(
    "text, key, words",
    [
        ("version: 1\ngres: {tpu_nmae: x}\n", "gres.tpu_nmae", "unknown key 'gres.tpu_nmae'"),
        ("version: 1\nfeatuers: {tpu: [a]}\n", "featuers.tpu", "unknown key 'featuers.tpu'"),
        ("version: 3\n", "version", "version 3 is not supported"),
        ("node_name: x\n", "version", "missing 'version: 2'"),
        ("version: 2\nfamilies: {gpu: {isolat: true}}\n", "families.gpu.isolat", "unknown key 'families.gpu.isolat'"),
        ("version: 2\nfamilies: {coral: {gres_name: x}}\n", "families.coral.gres_name", "unknown key"),
        ("version: 2\ngres: {tpu_name: x}\n", "gres.tpu_name", "unknown key 'gres.tpu_name'"),
        ("version: 1\nfamilies: {gpu: {isolate: true}}\n", "families.gpu.isolate", "unknown key"),
        ("version: 2\nfamilies: {edgetpu: {features: [a, '']}}\n", "families.edgetpu.features", "non-empty strings"),
        ("version: true\n", "version", "'version' has the wrong type"),
        ("version: 1\ndevices: {isolate_gpus: 'yes'}\n", "devices.isolate_gpus", "wrong type"),
        ("version: 1\ndevices: {idle: {mode: '0999'}}\n", "devices.idle.mode", "octal mode"),
        ("version: 1\nstate_dir: run/x\n", "state_dir", "absolute path"),
        ("version: 1\nfeatures: {tpu: [a, '']}\n", "features.tpu", "non-empty strings"),
    ],
)
def test_bad_configs_name_the_key(tmp_path, text, key, words):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(str(path))
    assert caught.value.key == key
    assert words in str(caught.value) and str(path) in str(caught.value)
    assert "\n" not in str(caught.value)


def test_yaml_syntax_error_names_the_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("version: 1\ngres:\n  tpu_name: [unclosed\n")
    with pytest.raises(ConfigError, match=r"c.yaml line \d+: .*fix the YAML syntax"):
        load_config(str(path))


def test_explicit_missing_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "nope.yaml"))


def test_top_level_must_be_a_mapping():
    with pytest.raises(ConfigError, match="must be a mapping"):
        parse_config(["version", 1])


def test_admin_guide_example_config_is_valid():
    """The admin guide's example is the reference admins copy: it must load as written."""
    import re
    from pathlib import Path

    import yaml

    guide = (Path(__file__).resolve().parents[2] / "docs" / "admin-guide.md").read_text()
    section = guide.split("## Configuration file", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block, "docs/admin-guide.md's Configuration file section has no yaml example"
    config = parse_config(yaml.safe_load(block.group(1)), where="docs/admin-guide.md")
    assert config.inventory_file == "/var/lib/slurm-tpu/inventory.json"
    assert config.family("gpu").types == {"a100_sxm4_80gb": "a100"}
    assert config.family("hailo").types == {"default": "hailo8", "0000:01:00.0": "hailo8l"}
