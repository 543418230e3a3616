"""Which GPU the runner asks Vulkan for (slurm_tpu/runner/gpu_select.py).

No GPU here: these tests cover the decision and the variables set for Mesa's
device-select layer, read from a layer manifest shaped like Debian's
(mesa-vulkan-drivers 22.3.6, /usr/share/vulkan/implicit_layer.d/).
"""

from __future__ import annotations

import json
import os

import pytest

from slurm_tpu.runner import gpu_select

H100_UUID = "GPU-4f6b0d8e-1c1e-7b2a-9f3e-0a1b2c3d4e5f"
DRIVER_INFO = {
    "0000:c3:00.0": {"Model": "NVIDIA H100", "GPU UUID": H100_UUID, "Device Minor": "1"},
    "0000:41:00.0": {"Model": "NVIDIA H100", "GPU UUID": "GPU-0000", "Device Minor": "0"},
}


@pytest.fixture
def layer_dir(tmp_path):
    directory = tmp_path / "implicit_layer.d"
    directory.mkdir()
    manifest = {
        "file_format_version": "1.0.0",
        "layer": {
            "name": "VK_LAYER_MESA_device_select",
            "type": "GLOBAL",
            "library_path": "libVkLayer_MESA_device_select.so",
            "disable_environment": {"NODEVICE_SELECT": "1"},
        },
    }
    (directory / "VkLayer_MESA_device_select.json").write_text(json.dumps(manifest))
    return (str(directory),)


def choose(environ, layer_dirs, openable=("/dev/nvidia0", "/dev/nvidia1")):
    return gpu_select.choose(
        environ, driver_info=lambda: DRIVER_INFO, layer_dirs=layer_dirs, openable=lambda: list(openable)
    )


@pytest.mark.parametrize(
    "address,tag",
    [
        ("0000:03:00.0", "pci-0000_03_00_0"),
        ("0000:C3:00.1", "pci-0000_c3_00_1"),
        ("10000:0a:1f.7", "pci-10000_0a_1f_7"),
    ],
)
def test_the_tag_is_mesas_format(address, tag):
    assert gpu_select.dri_prime_tag(address) == tag


def test_a_leased_gpu_is_the_only_one_vulkan_lists(layer_dir):
    choice = choose({"SLURM_TPU_GPUS": "pci-0000:c3:00.0,pci-0000:41:00.0", "CUDA_VISIBLE_DEVICES": "1,0"}, layer_dir)
    assert choice.pci_address == "0000:c3:00.0"
    assert choice.environment == {"DRI_PRIME": "pci-0000_c3_00_0", "MESA_VK_DEVICE_SELECT_FORCE_DEFAULT_DEVICE": "1"}
    assert choice.how.startswith("GPU 0000:c3:00.0 (from SLURM_TPU_GPUS), the only one Vulkan lists")
    assert not choice.uncertain


def test_a_cuda_uuid_is_resolved_through_the_nvidia_driver(layer_dir):
    choice = choose({"CUDA_VISIBLE_DEVICES": H100_UUID.lower()}, layer_dir)
    assert choice.pci_address == "0000:c3:00.0"
    assert choice.environment["DRI_PRIME"] == "pci-0000_c3_00_0"


def test_an_unknown_uuid_leaves_the_choice_to_the_cgroup(layer_dir):
    choice = choose({"CUDA_VISIBLE_DEVICES": "GPU-ffff"}, layer_dir)
    assert (choice.pci_address, choice.environment) == (None, {})
    assert "the NVIDIA driver does not list CUDA_VISIBLE_DEVICES' GPU-ffff" in choice.how


def test_slurm_indices_name_no_address(layer_dir):
    choice = choose({"CUDA_VISIBLE_DEVICES": "1"}, layer_dir)
    assert (choice.pci_address, choice.environment) == (None, {})
    assert choice.how == (
        "the first GPU Vulkan lists (CUDA_VISIBLE_DEVICES holds indices, which name no PCI "
        "address; the job's device cgroup or leases decide which GPUs that is)"
    )


@pytest.mark.parametrize("name", ["DRI_PRIME", "MESA_VK_DEVICE_SELECT", "NODEVICE_SELECT"])
def test_the_users_own_selection_is_kept(layer_dir, name):
    choice = choose({"SLURM_TPU_GPUS": "pci-0000:c3:00.0", name: "1"}, layer_dir)
    assert choice.environment == {}
    assert choice.how == f"the GPU {name}=1 selects (set by the user)"


def test_without_the_layer_other_openable_gpus_make_it_uncertain(tmp_path):
    nowhere = (str(tmp_path / "none"),)
    several = choose({"SLURM_TPU_GPUS": "pci-0000:c3:00.0"}, nowhere)
    assert several.environment == {} and several.uncertain
    assert "Mesa's device-select layer is not installed (apt install mesa-vulkan-drivers)" in several.how
    alone = choose({"SLURM_TPU_GPUS": "pci-0000:c3:00.0"}, nowhere, openable=("/dev/nvidia1",))
    assert not alone.uncertain


def test_apply_sets_the_variables_in_the_given_environment(layer_dir):
    environ = {"SLURM_TPU_GPUS": "pci-0000:41:00.0"}
    gpu_select.apply(choose(environ, layer_dir), environ)
    assert environ["DRI_PRIME"] == "pci-0000_41_00_0"
    assert environ["MESA_VK_DEVICE_SELECT_FORCE_DEFAULT_DEVICE"] == "1"


def test_openable_nodes_are_the_ones_this_process_may_open(tmp_path):
    (tmp_path / "dri").mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "dri/renderD128", "dri/card0"):
        (tmp_path / name).write_text("")
    (tmp_path / "nvidia1").chmod(0)
    found = gpu_select.openable_gpu_nodes(str(tmp_path))
    expected = [str(tmp_path / "nvidia0"), str(tmp_path / "dri" / "renderD128")]
    if os.geteuid() == 0:  # root may open a 0000 file
        expected.insert(1, str(tmp_path / "nvidia1"))
    assert found == expected
