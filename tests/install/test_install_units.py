"""install/uninstall/doctor pieces on their own, with this checkout's package (no wheel, no cluster)."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys

import pytest

from helpers import REPO
from slurm_tpu.config import DEFAULT_PATH
from slurm_tpu.hooks.enroot import HOOK_NAME as ENROOT_HOOK
from slurm_tpu.ops.doctor import state_dir_problems
from slurm_tpu.ops.install import (
    HOOK_FILES,
    Layout,
    installed_hook_text,
    missing_slurm_conf_lines,
    slurm_conf_lines,
    udev_run_program,
)
from slurm_tpu.slurm.parse import node_line_fields, parse_slurm_conf_options


def shipped(directory: str, name: str) -> str:
    with open(os.path.join(REPO, directory, name), encoding="utf-8") as handle:
        return handle.read()


@pytest.mark.parametrize("config", [DEFAULT_PATH, "/srv/etc/slurm-tpu/config.yaml"])
@pytest.mark.parametrize("directory,name", [(d, n) for d, n, _ in HOOK_FILES])
def test_installed_hook_differs_from_the_shipped_one_only_in_marked_lines(directory, name, config):
    text = shipped(directory, name)
    installed = installed_hook_text(text, name, "/opt/venv/bin/python", "/opt/venv/lib/site", config)
    old, new = text.splitlines(), installed.splitlines()
    if text.startswith("#!/usr/bin/python3"):
        assert new[0] == "#!/opt/venv/bin/python -IS"
        assert "_ROOT = '/opt/venv/lib/site'  # set by slurm-tpu install" in new
        assert [line for line in new if line.startswith("_ROOT")] == [
            "_ROOT = '/opt/venv/lib/site'  # set by slurm-tpu install"
        ]
        old, new = old[1:], new[1:]
    added = [line for line in new if line not in old]
    assert all(line.endswith("# set by slurm-tpu install") for line in added), added
    assert [line for line in old if line not in new] in ([], [kept for kept in old if kept.startswith("_ROOT = ")])
    assert any(config in line for line in added) == (config != DEFAULT_PATH and text.startswith("#!"))


def test_a_python_path_that_cannot_be_a_shebang_is_refused():
    from slurm_tpu.errors import SlurmTpuError

    with pytest.raises(SlurmTpuError, match="#! line"):
        installed_hook_text(
            shipped("epilog", "slurm-tpu-epilog"), "slurm-tpu-epilog", "/my venv/bin/python", "/x", DEFAULT_PATH
        )


def test_udev_rules_run_the_installed_hook_unless_told_otherwise():
    import dataclasses

    from slurm_tpu.config import Config
    from slurm_tpu.errors import SlurmTpuError

    layout, config = Layout("/opt/st"), Config()
    assert udev_run_program(layout, config) == "/opt/st/libexec/slurm-tpu/slurm-tpu-udev-event"
    # udev.run_program as configs wrote it before the hook existed: the console script, with its subcommand.
    old = dataclasses.replace(config, udev_run_program="/opt/venv/bin/slurm-tpu")
    assert udev_run_program(layout, old) == "/opt/venv/bin/slurm-tpu udev-event"
    # Any other program (a site's wrapper) runs as it is; --run-program wins over the config.
    assert udev_run_program(layout, old, "/usr/sbin/site-udev-hook") == "/usr/sbin/site-udev-hook"
    for bad, why in (
        ("bin/slurm-tpu", "absolute"),
        ("/opt/my venv/bin/slurm-tpu", "white space"),
        ("/opt/%k/hook", "white space, a quote"),
        ('/opt/"x/hook', "white space, a quote"),
    ):
        with pytest.raises(SlurmTpuError, match=why):
            udev_run_program(layout, config, bad)


def test_the_udev_hook_is_installed_beside_the_prolog():
    assert ("udev", "slurm-tpu-udev-event", 0o755) in HOOK_FILES
    assert Layout("/usr/local").udev_hook == "/usr/local/libexec/slurm-tpu/slurm-tpu-udev-event"
    text = shipped("udev", "slurm-tpu-udev-event")
    assert text.startswith("#!/usr/bin/python3 -IS\n") and "from slurm_tpu.hooks.udev_event import main" in text
    assert "slurm_tpu.cli" not in text  # not through the CLI (click): see tests/test_hooks_import_budget.py
    assert os.access(os.path.join(REPO, "udev", "slurm-tpu-udev-event"), os.X_OK)


def test_the_agent_unit_runs_the_installed_agent_before_slurmd():
    from slurm_tpu.config import Config
    from slurm_tpu.ops.install import planned_files

    layout = Layout("/opt/st", "/srv/etc")
    [unit] = [
        f
        for f in planned_files(layout, Config(), "/srv/etc/slurm")
        if f.path == "/srv/etc/systemd/system/slurm-tpu-agent.service"
    ]
    lines = unit.content.splitlines()
    assert f"ExecStart={layout.hooks_dir}/slurm-tpu-agent" in lines
    assert ("systemd", "slurm-tpu-agent", 0o755) in HOOK_FILES
    assert "Before=slurmd.service" in lines and "KillMode=process" in lines
    assert "@" not in unit.content  # every placeholder filled in


def test_each_shipped_file_is_in_the_directory_named_for_what_runs_or_reads_it():
    import ast

    from slurm_tpu.ops import node_files
    from slurm_tpu.ops.install import SYSTEMD_FILES

    # setup.py copies these directories into the wheel: the same ones node_files looks in.
    with open(os.path.join(REPO, "setup.py"), encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    [setup_dirs] = [
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "NODE_DIRS" for t in node.targets)
    ]
    assert (
        setup_dirs
        == node_files.NODE_DIRS
        == ("prolog", "epilog", "udev", "systemd", "slurm_conf", "hook_client", "enroot")
    )
    shipped_files = (
        {(directory, name) for directory, name, _ in HOOK_FILES}
        | {("systemd", name) for name, _ in SYSTEMD_FILES}
        | {("slurm_conf", "slurm.conf.snippet")}
        | {("hook_client", "slurm-tpu-hook-client.c")}  # what install builds the client from, never installed
        | {("enroot", ENROOT_HOOK)}  # into enroot's hooks.d, where enroot is (Layout.enroot_hook)
    )
    for directory, name in shipped_files:
        assert node_files.node_file(directory, name) == os.path.join(REPO, directory, name)
    # Nothing else there but the folders' READMEs (and what setup.py leaves out: the built client and
    # the native entries made beside the hooks, hook_client.build_native).
    on_disk = {
        (directory, name)
        for directory in node_files.NODE_DIRS
        for name in os.listdir(os.path.join(REPO, directory))
        if name not in ("README.md", "slurm-tpu-hook-client") and not name.endswith(("-native", "~", ".pyc", ".tmp"))
    }
    assert on_disk == shipped_files
    assert {d for d, name in shipped_files if name.endswith((".service", ".timer"))} == {"systemd"}
    assert ("udev", "slurm-tpu-udev-event") in shipped_files and ("systemd", "slurm-tpu-agent") in shipped_files


def test_slurm_conf_lines_come_from_the_snippet_and_lists_may_hold_more(tmp_path):
    from slurm_tpu.config import Config
    from slurm_tpu.ops.install import gres_types as gres_types_of

    hooks = f"{tmp_path}/libexec/slurm-tpu"  # nothing installed there: the hooks themselves
    wanted = slurm_conf_lines(Layout(str(tmp_path)), Config())
    assert wanted[:4] == [
        f"Prolog={hooks}/slurm-tpu-prolog",
        f"Epilog={hooks}/slurm-tpu-epilog",
        f"TaskProlog={hooks}/slurm-tpu-task-prolog",
        f"HealthCheckProgram={hooks}/slurm-tpu-health",
    ]
    # Ours among more (mps), in another order: every registered family's GRES name is there.
    gres_types = ",".join(["mps", *reversed(gres_types_of(Config()).split(","))])
    text = f"""
ClusterName=c   # a comment
Prolog=/site/prolog,{hooks}/slurm-tpu-prolog
epilog={hooks}/slurm-tpu-epilog
TaskProlog=/opt/slurm-tpu/prolog/slurm-tpu-task-prolog
HealthCheckProgram={hooks}/slurm-tpu-health HealthCheckInterval=300
GresTypes={gres_types}
NodeName=n1 Gres=tpu:edgetpu_usb:1 Prolog=/not/an/option
Include /etc/slurm/nodes.conf
"""
    options = parse_slurm_conf_options(text)
    assert options["prolog"] == f"/site/prolog,{hooks}/slurm-tpu-prolog"
    assert "include" not in options and "gres" not in options
    assert missing_slurm_conf_lines(wanted, options) == [
        f"TaskProlog={hooks}/slurm-tpu-task-prolog",
        "HealthCheckNodeState=ANY",
    ]


def test_slurm_conf_names_the_native_entries_where_they_are_installed(tmp_path):
    """Layout.hook decides, from what is in the hooks directory: a native entry there is named (the
    hook without an interpreter), else the hook; never under a config the native entries do not read."""
    from slurm_tpu.config import Config

    layout = Layout(str(tmp_path), "/etc")  # reads /etc/slurm-tpu/config.yaml, as the native entries do
    hooks = layout.hooks_dir
    os.makedirs(hooks)
    sh_lines = [
        f"Prolog={hooks}/slurm-tpu-prolog",
        f"Epilog={hooks}/slurm-tpu-epilog",
        f"TaskProlog={hooks}/slurm-tpu-task-prolog",
        f"HealthCheckProgram={hooks}/slurm-tpu-health",
    ]
    assert slurm_conf_lines(layout, Config())[:4] == sh_lines
    for name in ("slurm-tpu-prolog-native", "slurm-tpu-epilog-native", "slurm-tpu-task-prolog-native"):
        with open(os.path.join(hooks, name), "wb") as handle:
            handle.write(b"\x7fELF")
    assert slurm_conf_lines(layout, Config())[:4] == [
        f"Prolog={hooks}/slurm-tpu-prolog-native",
        f"Epilog={hooks}/slurm-tpu-epilog-native",
        f"TaskProlog={hooks}/slurm-tpu-task-prolog-native",
        f"HealthCheckProgram={hooks}/slurm-tpu-health",  # no native entry: a sh wrapper
    ]
    # The same hooks directory under another config: the native entries would not read it.
    assert slurm_conf_lines(Layout(str(tmp_path), str(tmp_path / "etc")), Config())[:4] == sh_lines


def test_node_line_fields_takes_defaults_and_ranges():
    text = "NodeName=DEFAULT Feature=x CPUs=2\nNodeName=n[1-3] Gres=tpu:edgetpu_usb:1\nNodeName=m1 Gres=gpu:a:1\n"
    assert node_line_fields(text, "n2") == {
        "NodeName": "n[1-3]",
        "Feature": "x",
        "CPUs": "2",
        "Gres": "tpu:edgetpu_usb:1",
    }
    assert node_line_fields(text, "n9") is None


def test_state_dir_problems_name_the_directory_and_the_fix(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the state directory must be root's")
    state = tmp_path / "state"
    assert state_dir_problems(str(state)) == [
        (
            f"state directory {state} does not exist",
            "slurm-tpu gres-conf --output <gres.conf> (or slurm-tpu boot after a reboot)",
        )
    ]
    state.mkdir(mode=0o755)
    (state / "jobs").mkdir(mode=0o755)
    assert state_dir_problems(str(state)) == []
    os.chmod(state / "jobs", 0o700)
    [(problem, fix)] = state_dir_problems(str(state))
    assert problem == f"{state}/jobs is mode 0700: the task-prolog cannot read it"
    assert fix == f"chown root:root {state}/jobs && chmod 0755 {state}/jobs"
    os.chmod(state / "jobs", 0o755)
    (state / "job-usage").mkdir(mode=0o755)
    os.chmod(state / "job-usage", 0o777)  # a world-writable box parent: anyone could plant a job's box
    [(problem, fix)] = state_dir_problems(str(state))
    assert f"{state}/job-usage" in problem and "writable" in problem
    assert fix == f"chown root:root {state}/job-usage && chmod 0755 {state}/job-usage"
    os.chmod(state / "job-usage", 0o755)
    assert state_dir_problems(str(state)) == []
    os.rename(state, tmp_path / "real")
    os.symlink(tmp_path / "real", state)
    [(problem, _)] = state_dir_problems(str(state))
    assert "symlink" in problem


def slurm_tpu(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "slurm_tpu.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        env={k: v for k, v in os.environ.items() if k != "SLURM_TPU_CONFIG"},
    )


def test_an_upgrade_removes_the_hook_files_it_no_longer_ships_unless_changed(tmp_path):
    """What an earlier install wrote that this version does not ship (the sh Prolog's .py worker, the sh
    library, the client's source): gone after install, and from the manifest, unless changed since."""
    if os.geteuid() != 0:
        pytest.skip("install runs as root")
    from slurm_tpu.ops.install import Layout, Manifest
    from slurm_tpu.protocol.install_manifest import ABSENT, file_entry

    prefix = tmp_path / "p"
    args = ["--prefix", str(prefix), "--sysconfdir", str(prefix / "etc"), "--slurm-conf", str(tmp_path / "none")]
    assert slurm_tpu("install", *args).returncode == 0
    layout = Layout(str(prefix), str(prefix / "etc"))
    manifest = Manifest.load(layout)
    assert manifest is not None
    old = {name: os.path.join(layout.hooks_dir, name) for name in ("slurm-tpu-lib.sh", "slurm-tpu-prolog.py")}
    for path in old.values():  # as an earlier install wrote them
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("# an earlier slurm-tpu's\n")
        manifest.files[path] = file_entry(path, ABSENT, hashlib.sha256(b"# an earlier slurm-tpu's\n").hexdigest())
    with open(layout.manifest, "w", encoding="utf-8") as handle:
        handle.write(manifest.text())
    with open(old["slurm-tpu-prolog.py"], "a", encoding="utf-8") as handle:
        handle.write("# the admin's line\n")
    done = slurm_tpu("install", *args)
    assert done.returncode == 0, done.stderr
    assert f"remove {old['slurm-tpu-lib.sh']} (no longer used)" in done.stdout.splitlines()
    assert not os.path.lexists(old["slurm-tpu-lib.sh"]) and os.path.exists(old["slurm-tpu-prolog.py"])
    files = Manifest.load(layout).files  # type: ignore[union-attr]
    assert old["slurm-tpu-lib.sh"] not in files and old["slurm-tpu-prolog.py"] in files


def test_uninstall_leaves_what_was_there_and_what_changed_since(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("install runs as root")
    prefix = tmp_path / "p"
    args = ["--prefix", str(prefix), "--sysconfdir", str(prefix / "etc")]
    # An identical rules file was there already (an admin ran `slurm-tpu udev-rules --output` before,
    # with the same --prefix: both name the udev hook install puts there).
    rules = prefix / "etc" / "udev" / "rules.d" / "60-slurm-tpu.rules"
    rules.parent.mkdir(parents=True)
    done = slurm_tpu("udev-rules", "--prefix", str(prefix), "--output", str(rules))
    assert done.returncode == 0, done.stderr
    assert f'RUN+="{prefix}/libexec/slurm-tpu/slurm-tpu-udev-event"' in rules.read_text()
    done = slurm_tpu("install", *args, "--slurm-conf", str(tmp_path / "none"))
    assert done.returncode == 0, done.stderr
    assert f"unchanged {rules}" in done.stdout.splitlines()
    assert os.access(prefix / "libexec" / "slurm-tpu" / "slurm-tpu-udev-event", os.X_OK)
    # The agent's C client is built and recorded by install (its source is not installed: nothing
    # there builds it), so uninstall removes it below.
    client = prefix / "libexec" / "slurm-tpu" / "slurm-tpu-hook-client"
    assert os.access(client, os.X_OK) and not (client.parent / "slurm-tpu-hook-client.c").exists()
    # Its native entries read /etc/slurm-tpu/config.yaml, not this --sysconfdir's config: not installed.
    assert (
        f"native entries not installed: they read {DEFAULT_PATH}, this installation's hooks "
        f"{prefix}/etc/slurm-tpu/config.yaml; slurm.conf names the hooks themselves"
    ) in done.stdout.splitlines()
    assert not [name for name in os.listdir(client.parent) if name.endswith("-native")]
    assert f"  Prolog={prefix}/libexec/slurm-tpu/slurm-tpu-prolog" in done.stdout.splitlines()
    prolog = prefix / "libexec" / "slurm-tpu" / "slurm-tpu-prolog"
    prolog.write_text(prolog.read_text() + "# a local change\n")
    done = slurm_tpu("uninstall", *args, "--purge")
    assert done.returncode == 0, done.stderr
    assert f"kept {prolog} (changed since slurm-tpu install wrote it; remove it by hand)" in done.stdout
    assert sorted(os.listdir(prolog.parent)) == ["slurm-tpu-prolog"]
    assert rules.exists()  # not ours: it was there before
    assert not (prefix / "etc" / "slurm-tpu").exists() and not (prefix / "etc" / "systemd").exists()
    done = slurm_tpu("uninstall", *args)
    assert done.returncode == 2 and "nothing to uninstall" in done.stderr


NATIVE_ENTRIES = ("slurm-tpu-prolog-native", "slurm-tpu-epilog-native", "slurm-tpu-task-prolog-native")


def snapshot(root) -> dict[str, tuple]:
    """path -> (inode, mtime, owner, mode, sha256 of a file's bytes) of everything under ``root``:
    a file written again, even with the same bytes, shows as changed."""
    from helpers import walk_files

    return {
        path: (info.st_ino, info.st_mtime_ns, info.st_uid, info.st_gid, info.st_mode, digest)
        for path, (info, digest) in walk_files(root).items()
    }


def install_in_process(tmp_path, monkeypatch, compiler_needed: bool = True):
    """(layout, what install said, its result): ``install`` into a prefix under ``tmp_path`` whose
    config is, for install and doctor, the one the native entries read (they read
    /etc/slurm-tpu/config.yaml, which a test cannot install into: the layout's own config stands in
    for it as ``install.DEFAULT_CONFIG``, so the installed hooks do not name it either, as on a
    default installation)."""
    from slurm_tpu.config import Config
    from slurm_tpu.ops import install as install_module
    from slurm_tpu.ops.hook_client import compiler

    if os.geteuid() != 0:
        pytest.skip("install runs as root")
    if compiler_needed and compiler() is None:
        pytest.skip("no C compiler: no native entries")
    layout = Layout(str(tmp_path / "p"), str(tmp_path / "p" / "etc"))
    monkeypatch.setattr(install_module, "DEFAULT_CONFIG", layout.config_file)
    assert layout.native_entries_fit
    said: list[str] = []
    result = install_module.install(layout, Config(), str(tmp_path / "none"), say=said.append)
    return layout, said, result


def test_install_puts_the_native_entries_beside_the_hooks_and_uninstall_removes_them(tmp_path, monkeypatch):
    from slurm_tpu.config import Config
    from slurm_tpu.ops.install import Manifest, install, uninstall

    layout, said, result = install_in_process(tmp_path, monkeypatch)
    hooks = layout.hooks_dir
    with open(os.path.join(hooks, "slurm-tpu-hook-client"), "rb") as handle:
        client = handle.read()
    recorded = Manifest.load(layout).files
    for name in NATIVE_ENTRIES:
        entry = os.path.join(hooks, name)
        assert f"write {entry}" in said
        info = os.lstat(entry)
        assert (stat.S_ISREG(info.st_mode), info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (
            True,
            0,
            0,
            0o755,
        )
        with open(entry, "rb") as handle:
            assert handle.read() == client  # a copy of the client, under the manifest's rules
        assert os.access(entry.removesuffix("-native"), os.X_OK)  # its Python hook, beside it
        assert recorded[entry]["before"] == "absent"
    # slurm.conf is to name them (HealthCheckProgram has none: the sh wrapper).
    assert list(result.missing_lines[:4]) == [
        f"Prolog={hooks}/slurm-tpu-prolog-native",
        f"Epilog={hooks}/slurm-tpu-epilog-native",
        f"TaskProlog={hooks}/slurm-tpu-task-prolog-native",
        f"HealthCheckProgram={hooks}/slurm-tpu-health",
    ]
    # The installed TaskProlog entry is the task prolog: the job's lines from the state directory.
    state = tmp_path / "state"
    (state / "jobs").mkdir(parents=True)
    (state / "jobs" / "7.env").write_text("export SLURM_TPU_DEVICES=usb-1\n", encoding="utf-8")
    (tmp_path / "config.yaml").write_text(f"state_dir: {state}\n", encoding="utf-8")
    done = subprocess.run(
        [os.path.join(hooks, "slurm-tpu-task-prolog-native")],
        env={"PATH": "/usr/bin:/bin", "SLURM_TPU_CONFIG": str(tmp_path / "config.yaml"), "SLURM_JOB_ID": "7"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (done.returncode, done.stdout) == (0, "export EDGETPU_VISIBLE_DEVICES=\nexport SLURM_TPU_DEVICES=usb-1\n")
    # Again: nothing is written, not even the same bytes.
    before = snapshot(tmp_path / "p")
    again: list[str] = []
    install(layout, Config(), str(tmp_path / "none"), say=again.append)
    assert snapshot(tmp_path / "p") == before
    assert not [line for line in again if line.startswith(("write", "replace", "create", "fix"))], again
    assert {f"unchanged {hooks}/{name}" for name in NATIVE_ENTRIES} <= set(again)
    # Uninstall removes them with the rest of what install made.
    removed: list[str] = []
    assert uninstall(layout, purge=True, say=removed.append) == []
    assert {f"remove {hooks}/{name}" for name in NATIVE_ENTRIES} <= set(removed)
    assert not (tmp_path / "p").exists()


def test_without_a_compiler_install_names_the_sh_hooks(tmp_path, monkeypatch):
    (tmp_path / "no-cc").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "no-cc"))  # neither cc nor gcc: the client cannot be built
    monkeypatch.delenv("CC", raising=False)
    layout, said, result = install_in_process(tmp_path, monkeypatch, compiler_needed=False)
    hooks = layout.hooks_dir
    assert "slurm-tpu-hook-client not built (no C compiler); the hooks run the Python hooks (slower)" in said
    assert not [name for name in os.listdir(hooks) if name == "slurm-tpu-hook-client" or name.endswith("-native")]
    assert list(result.missing_lines[:3]) == [
        f"Prolog={hooks}/slurm-tpu-prolog",
        f"Epilog={hooks}/slurm-tpu-epilog",
        f"TaskProlog={hooks}/slurm-tpu-task-prolog",
    ]


def test_doctor_accepts_a_hook_or_its_native_entry_and_flags_a_writable_one(tmp_path, monkeypatch):
    from slurm_tpu.config import Config
    from slurm_tpu.hardware import Inventory
    from slurm_tpu.ops.doctor import Node, check_hooks

    layout, _, _ = install_in_process(tmp_path, monkeypatch)
    hooks, conf = layout.hooks_dir, tmp_path / "slurm.conf"

    def lines(which: Layout = layout) -> list[str]:
        return [finding.line() for finding in check_hooks(Node(Config(), which, str(conf), "n1", Inventory()))]

    def name(suffix: str) -> None:
        conf.write_text(
            f"Prolog={hooks}/slurm-tpu-prolog{suffix}\nEpilog={hooks}/slurm-tpu-epilog{suffix}\n"
            f"TaskProlog={hooks}/slurm-tpu-task-prolog{suffix}\nHealthCheckProgram={hooks}/slurm-tpu-health\n",
            encoding="utf-8",
        )

    everything = "Prolog, Epilog, TaskProlog, HealthCheckProgram are slurm-tpu's in"
    name("")
    assert lines() == [f"ok    hooks: {everything} {hooks}, root's, not writable by others"]
    name("-native")
    natives = "(Prolog, Epilog, TaskProlog: native entries)"
    assert lines() == [f"ok    hooks: {everything} {hooks} {natives}, root's, not writable by others"]
    # Whoever can write a native entry, or the Python hook it runs without the agent, runs code as root.
    for path in (f"{hooks}/slurm-tpu-prolog-native", f"{hooks}/slurm-tpu-prolog"):
        os.chmod(path, 0o777)
        assert lines() == [
            f"FAIL  hooks: Prolog {path} is uid 0 mode 0777: whoever can write it runs code as root on every job; "
            f"fix: chown root:root {path} && chmod 0755 {path}"
        ]
        os.chmod(path, 0o755)
    # Under a config the native entries do not read, slurm.conf must name the hooks themselves.
    other = Layout(layout.prefix, str(tmp_path / "elsewhere"))
    assert lines(other)[0] == (
        f"FAIL  hooks: slurm.conf Prolog={hooks}/slurm-tpu-prolog-native reads {DEFAULT_PATH}, not this "
        f"installation's {other.config_file}; fix: set Prolog={hooks}/slurm-tpu-prolog in {conf}, "
        "then scontrol reconfigure"
    )
    # Naming neither: the fix names what install prints, the native entry.
    conf.write_text("Epilog=/site/epilog\n", encoding="utf-8")
    assert lines()[:2] == [
        f"FAIL  hooks: slurm.conf Prolog= has no such line, not slurm-tpu's {hooks}/slurm-tpu-prolog-native; "
        f"fix: set Prolog={hooks}/slurm-tpu-prolog-native in {conf}, then scontrol reconfigure",
        f"FAIL  hooks: slurm.conf Epilog= names /site/epilog, not slurm-tpu's {hooks}/slurm-tpu-epilog-native; "
        f"fix: set Epilog={hooks}/slurm-tpu-epilog-native in {conf}, then scontrol reconfigure",
    ]


def test_install_refuses_non_root_without_dry_run(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to run as nobody")
    done = subprocess.run(
        ["runuser", "-u", "nobody", "--", sys.executable, "-m", "slurm_tpu.cli", "install", "--prefix", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )
    assert done.returncode == 2, done.stderr
    assert "slurm-tpu install must run as root" in done.stderr


def test_doctor_checks_the_program_the_udev_rules_run(tmp_path):
    import dataclasses

    from slurm_tpu.config import Config
    from slurm_tpu.hardware import Inventory
    from slurm_tpu.ops.doctor import Node, check_udev_rules
    from slurm_tpu.render.udev_rules import render_udev_rules

    if os.geteuid() != 0:
        pytest.skip("the programs must be root's")
    layout = Layout(str(tmp_path / "p"), str(tmp_path / "etc"))

    def check(config: Config, write_rules: bool = True) -> str:
        """doctor's one line on the udev rules, after (as install would) writing them for ``config``."""
        if write_rules:
            os.makedirs(os.path.dirname(layout.udev_rules), exist_ok=True)
            with open(layout.udev_rules, "w", encoding="utf-8") as handle:
                handle.write(render_udev_rules(config, udev_run_program(layout, config)))
        [finding] = check_udev_rules(Node(config, layout, str(tmp_path / "slurm.conf"), "n1", Inventory()))
        return " ".join(finding.line().split())

    assert check(Config()) == (
        f"FAIL udev rules: {layout.udev_rules} runs {layout.udev_hook} is missing; "
        f"fix: slurm-tpu install --prefix {layout.prefix}"
    )
    os.makedirs(layout.hooks_dir)
    with open(layout.udev_hook, "w", encoding="utf-8") as handle:
        handle.write(shipped("udev", "slurm-tpu-udev-event"))
    os.chmod(layout.udev_hook, 0o775)
    assert check(Config()).startswith(
        f"FAIL udev rules: {layout.udev_rules} runs {layout.udev_hook} is uid 0 "
        "mode 0775: whoever can write it runs code as root on every device event"
    )
    os.chmod(layout.udev_hook, 0o755)
    assert check(Config()) == f"ok udev rules: {layout.udev_rules} (RUN+={layout.udev_hook})"
    # An old config naming the console script through a link (docs/admin-guide.md's install steps make one).
    os.symlink(layout.udev_hook, tmp_path / "slurm-tpu")
    old = dataclasses.replace(Config(), udev_run_program=str(tmp_path / "slurm-tpu"))
    assert check(old) == f"ok udev rules: {layout.udev_rules} (RUN+={tmp_path}/slurm-tpu udev-event)"
    bad = dataclasses.replace(Config(), udev_run_program="/opt/my venv/bin/slurm-tpu")
    assert check(bad, write_rules=False).startswith(
        "FAIL udev rules: udev run program '/opt/my venv/bin/slurm-tpu' holds white space"
    )


@pytest.fixture(scope="module")
def doubles(tmp_path_factory):
    """(honours, ignores): the libedgetpu double as the patched library and as Coral's own build."""
    from edgetpu_double.build import build_double

    try:
        return (
            build_double(tmp_path_factory.mktemp("patched")),
            build_double(tmp_path_factory.mktemp("coral"), ignores_visible=True),
        )
    except RuntimeError as exc:
        pytest.skip(str(exc))


def test_install_replaces_corals_libedgetpu_and_uninstall_puts_it_back(tmp_path, doubles):
    """A node with libedgetpu1-std: its library file and soname link, as the package lays them out."""
    if os.geteuid() != 0:
        pytest.skip("install runs as root")
    patched, coral = doubles
    prefix, libdir = tmp_path / "p", tmp_path / "lib"
    libdir.mkdir()
    (libdir / "libedgetpu.so.1.0").write_bytes(coral.read_bytes())
    os.symlink("libedgetpu.so.1.0", libdir / "libedgetpu.so.1")
    args = ["--prefix", str(prefix), "--sysconfdir", str(prefix / "etc")]
    install = ["install", *args, "--slurm-conf", str(tmp_path / "none"), "--libdir", str(libdir)]
    # Coral's own build is refused in one line, before anything is written.
    done = slurm_tpu(*install, "--libedgetpu", str(coral))
    assert done.returncode == 2 and not prefix.exists()
    assert done.stderr.splitlines() == [
        f"slurm-tpu: error: --libedgetpu {coral} ignores EDGETPU_VISIBLE_DEVICES: unmodified Coral code in a job "
        "(pycoral's make_interpreter(model), list_edge_tpus()) sees every Edge TPU of the node and opens the first, "
        "not the job's: build the patched one with scripts/build-libedgetpu.sh"
    ]
    done = slurm_tpu(*install, "--libedgetpu", str(patched))
    assert done.returncode == 0, done.stderr
    assert f"replace {libdir}/libedgetpu.so.1.0" in done.stdout.splitlines()
    assert f"unchanged {libdir}/libedgetpu.so.1 -> libedgetpu.so.1.0" in done.stdout.splitlines()
    assert (libdir / "libedgetpu.so.1").read_bytes() == patched.read_bytes()  # what dlopen finds
    from slurm_tpu.ops.edgetpu_runtime import visible_devices_problem

    assert visible_devices_problem(str(libdir / "libedgetpu.so.1")) is None
    again = slurm_tpu(*install, "--libedgetpu", str(patched))
    assert again.returncode == 0 and f"unchanged {libdir}/libedgetpu.so.1.0" in again.stdout.splitlines()
    done = slurm_tpu("uninstall", *args, "--purge")
    assert done.returncode == 0, done.stderr
    assert (libdir / "libedgetpu.so.1.0").read_bytes() == coral.read_bytes()  # Coral's, back
    assert os.readlink(libdir / "libedgetpu.so.1") == "libedgetpu.so.1.0"  # the package's link was left
    assert sorted(os.listdir(libdir)) == ["libedgetpu.so.1", "libedgetpu.so.1.0"]


def test_install_puts_the_library_on_a_node_without_one(tmp_path, doubles):
    if os.geteuid() != 0:
        pytest.skip("install runs as root")
    patched, _ = doubles
    prefix, libdir = tmp_path / "p", tmp_path / "lib"
    args = ["--prefix", str(prefix), "--sysconfdir", str(prefix / "etc")]
    done = slurm_tpu(
        "install", *args, "--slurm-conf", str(tmp_path / "none"), "--libdir", str(libdir), "--libedgetpu", str(patched)
    )
    assert done.returncode == 0, done.stderr
    assert os.readlink(libdir / "libedgetpu.so.1") == "libedgetpu.so.1.0"
    assert (libdir / "libedgetpu.so.1.0").read_bytes() == patched.read_bytes()
    done = slurm_tpu("uninstall", *args, "--purge")
    assert done.returncode == 0, done.stderr
    assert not libdir.exists()  # made by install, empty again


def test_doctor_says_where_the_device_cgroup_holds(tmp_path):
    """ConstrainDevices=yes on an Edge TPU node: a failure under 22.05 (it does nothing for tpu), the
    holds/does-not-hold sentence from 23.02 on; off or on a node without Edge TPUs, nothing to fix."""
    from helpers import detect_json
    from slurm_tpu.config import Config
    from slurm_tpu.families import inventory_from_json
    from slurm_tpu.hardware import Inventory
    from slurm_tpu.ops.doctor import Node, check_device_cgroup
    from slurm_tpu.slurm import device_cgroup
    from slurm_tpu.slurm.commands import Slurm
    from slurm_tpu.slurm.installation import version_of

    tpus = inventory_from_json(detect_json("big_node"))
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nTaskPlugin=task/affinity,task/cgroup\n")
    layout = Layout(str(tmp_path / "p"), str(tmp_path / "etc"))

    def finding(inventory=tpus):
        [found] = check_device_cgroup(Node(Config(), layout, str(conf), "n1", inventory))
        return found

    off = finding()
    assert off.ok and off.message.startswith("off (no ConstrainDevices=yes")
    (tmp_path / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nconstraindevices=Yes  # on\n")
    on = finding()
    version = version_of(Slurm.for_config(Config()).program("slurmd"))
    if device_cgroup.covers_gres_without_plugin(version):
        assert on.ok and "PCIe cards always; USB sticks only until their first re-enumeration" in on.message
    else:
        assert not on.ok and on.line().startswith(
            f"FAIL  device cgroup: ConstrainDevices=yes does nothing for gres/tpu or gres/npu under Slurm {version}"
        )
        assert "fix: do not count on it for Edge TPUs or NPUs: run Slurm 23.02 or later" in on.line()
    assert finding(Inventory()).ok  # GPUs only: the layer works for gres/gpu on every release
    # Both releases, without their slurmd: the facts of slurm_tpu/slurm/device_cgroup.py.
    options = {"taskplugin": "task/cgroup"}
    assert device_cgroup.status(options, str(conf), "22.05.8", True)[0] is False
    assert device_cgroup.status(options, str(conf), "23.02.0", True)[0] is True
    assert device_cgroup.status(options, str(conf), "25.11.7", True)[0] is True
    assert device_cgroup.status({"taskplugin": "task/none"}, str(conf), "22.05.8", True)[0] is True


def test_doctor_says_whether_the_gres_plugin_spares_the_prologs_query(tmp_path):
    """An Edge TPU node: with gres_tpu.so in a PluginDir directory the Prolog asks slurmctld nothing (unless
    the node leases another GRES too); without it, one line says each Prolog asks, and how to spare it.
    Never a failure (the plugin is optional); nothing on a node without Edge TPUs."""
    from helpers import detect_json
    from slurm_tpu.config import Config
    from slurm_tpu.families import inventory_from_json
    from slurm_tpu.hardware import Inventory
    from slurm_tpu.ops.doctor import Node, check_gres_plugin

    tpus = inventory_from_json(detect_json("big_node"))
    conf = tmp_path / "slurm.conf"
    layout = Layout(str(tmp_path / "p"), str(tmp_path / "etc"))
    plugins = tmp_path / "plugins"
    plugins.mkdir()

    def finding(inventory=tpus):
        found = check_gres_plugin(Node(Config(), layout, str(conf), "n1", inventory))
        assert all(f.ok for f in found)
        return [f.message for f in found]

    conf.write_text("ClusterName=x\n")
    [without] = finding()
    assert without.startswith("no gres_tpu.so in slurm.conf's PluginDir: each Prolog asks slurmctld")
    conf.write_text(f"ClusterName=x\nPluginDir=/usr/lib/x86_64-linux-gnu/slurm-wlm:{plugins}\n")
    assert finding()[0].startswith("no gres_tpu.so")  # the directory is named, the plugin is not there
    (plugins / "gres_tpu.so").write_bytes(b"")
    [loaded] = finding()
    kinds = {Config().family(a.kind).gres_name for a in tpus}
    assert loaded.startswith(f"{plugins}/gres_tpu.so is in PluginDir: ")
    if kinds == {"tpu"}:
        assert loaded.endswith("asks slurmctld nothing")
    else:
        assert "so each Prolog still asks slurmctld" in loaded
    assert finding(Inventory()) == []


def test_install_puts_the_accounting_timer_in_place_and_doctor_says_when_it_is_missing_stale_or_off(
    tmp_path, monkeypatch
):
    """The collector's units (slurm-tpu-accounting.{service,timer}) as install writes every unit: atomically,
    the site's different file kept as a backup, nothing rewritten when nothing changed; doctor names, in
    one line with its fix, the first thing keeping the jobs' figures from Slurm where slurmdbd is in use."""
    from slurm_tpu.config import Config
    from slurm_tpu.hardware import Inventory
    from slurm_tpu.ops import install as install_module
    from slurm_tpu.ops.doctor import Node, check_accounting_collector

    layout, said, _ = install_in_process(tmp_path, monkeypatch, compiler_needed=False)
    service = os.path.join(layout.systemd_dir, "slurm-tpu-accounting.service")
    timer = os.path.join(layout.systemd_dir, "slurm-tpu-accounting.timer")
    assert f"write {service}" in said and f"write {timer}" in said
    with open(service, encoding="utf-8") as handle:
        assert "ExecStart=" in handle.read() and os.stat(service).st_mode & 0o777 == 0o644
    with open(timer, encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    assert "OnUnitActiveSec=60" in lines and "WantedBy=timers.target" in lines

    conf, spool = tmp_path / "slurm.conf", tmp_path / "var" / "accounting-spool"
    node = Node(Config(accounting_spool=str(spool)), layout, str(conf), "n1", Inventory())

    def line() -> str:
        [finding] = check_accounting_collector(node)
        return finding.line()

    conf.write_text("AccountingStorageType=accounting_storage/none\n")
    assert line() == "ok    accounting collector: Slurm's accounting is off (no slurmdbd): no collector needed"
    conf.write_text("AccountingStorageType=accounting_storage/slurmdbd\n")
    assert line() == (
        "FAIL  accounting collector: slurm-tpu-accounting.timer is not enabled: the epilog spools no figures "
        "and none reach Slurm's AdminComment; fix: systemctl enable --now slurm-tpu-accounting.timer"
    )
    wants = os.path.join(layout.systemd_dir, "timers.target.wants")
    os.makedirs(wants)
    os.symlink(timer, os.path.join(wants, "slurm-tpu-accounting.timer"))  # what systemctl enable makes
    assert line() == f"ok    accounting collector: slurm-tpu-accounting.timer enabled; spool {spool}"
    spool.mkdir(parents=True, mode=0o755)
    os.chmod(spool, 0o755)
    assert line() == (
        f"FAIL  accounting collector: accounting spool {spool} is uid 0 mode 0755, not root's 0700: the epilog "
        f"spools nothing; fix: chown root:root {spool} && chmod 0700 {spool}"
    )
    os.chmod(spool, 0o700)
    assert line().startswith("ok    ")
    # Its parent a link to a directory of root's: the epilog refuses the spool (it never follows one), so doctor does.
    os.rename(spool.parent, tmp_path / "var-real")
    os.symlink(tmp_path / "var-real", spool.parent)
    refused = line()
    assert refused.startswith(f"FAIL  accounting collector: accounting spool {spool}: ") and "is a symlink" in refused
    assert refused.endswith(f"fix: make {spool.parent} a directory of root's, not a link")
    os.unlink(spool.parent)
    os.rename(tmp_path / "var-real", spool.parent)
    assert line().startswith("ok    ")
    # An edit since install: stale, and install puts its own back.
    with open(service, "a", encoding="utf-8") as handle:
        handle.write("# the admin's line\n")
    fix = f"fix: slurm-tpu install --sysconfdir {layout.sysconfdir}"
    assert line() == f"FAIL  accounting collector: {service} is stale (not what this slurm-tpu installs); {fix}"
    again: list[str] = []
    install_module.install(layout, Config(), str(tmp_path / "none"), say=again.append)
    assert f"replace {service}" in again and f"unchanged {timer}" in again
    assert line().startswith("ok    ")
    third: list[str] = []
    install_module.install(layout, Config(), str(tmp_path / "none"), say=third.append)
    assert f"unchanged {service}" in third and f"unchanged {timer}" in third  # idempotent
    os.unlink(timer)
    assert line() == (
        f"FAIL  accounting collector: {timer} is missing: no collector puts the jobs' inference figures into "
        f"Slurm's AdminComment; {fix}"
    )
    # A collector unit the admin wrote before (as docs/accounting.md once asked): kept as a backup, which
    # uninstall puts back.
    other = Layout(str(tmp_path / "q"), str(tmp_path / "q" / "etc"))
    site = os.path.join(other.systemd_dir, "slurm-tpu-accounting.service")
    os.makedirs(other.systemd_dir)
    with open(site, "w", encoding="utf-8") as handle:
        handle.write("[Service]\nExecStart=/usr/local/bin/slurm-tpu accounting-collect --every 60\n")
    said = []
    install_module.install(other, Config(), str(tmp_path / "none"), say=said.append)
    assert f"replace {site}" in said
    with open(site + ".slurm-tpu.bak", encoding="utf-8") as handle:
        assert "--every 60" in handle.read()
    install_module.uninstall(other, say=said.append)
    with open(site, encoding="utf-8") as handle:
        assert "--every 60" in handle.read()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod)")
def test_doctor_names_a_node_with_an_accelerators_numbers_that_no_lease_manages(tmp_path):
    """A copy of an Edge TPU's node (an admin's mknod, same numbers) keeps its own owner and mode whichever
    job holds the card: doctor names it, with the fix; the card's own node and its slot are not named."""
    import dataclasses

    from helpers import detect_json
    from slurm_tpu.config import Config
    from slurm_tpu.families import inventory_from_json
    from slurm_tpu.hardware import Inventory
    from slurm_tpu.ops.doctor import Node, check_unmanaged_nodes

    dev = tmp_path / "dev"
    dev.mkdir()
    card = next(a for a in inventory_from_json(detect_json("big_node")) if a.device_nodes)
    own, copy = str(dev / "apex_0"), str(dev / "my-tpu")
    os.mknod(own, stat.S_IFCHR | 0o600, os.makedev(240, 41))
    os.mknod(copy, stat.S_IFCHR | 0o600, os.makedev(240, 41))
    os.chmod(copy, 0o666)
    config = Config(slot_dir=str(tmp_path / "slots"))
    inventory = Inventory(accelerators=(dataclasses.replace(card, device_nodes=(own,)),))
    layout = Layout(str(tmp_path / "p"), str(tmp_path / "etc"))
    node = Node(config, layout, str(tmp_path / "slurm.conf"), "n1", inventory)
    [finding] = check_unmanaged_nodes(node, str(dev))
    assert not finding.ok and finding.line() == (
        f"FAIL  device nodes: {copy} has {card.identity}'s numbers (240:41) but is not one slurm-tpu leases "
        f"(uid 0, mode 0666): whoever it lets in opens the device, whichever job holds it; fix: rm {copy}"
    )
    os.unlink(copy)
    [finding] = check_unmanaged_nodes(node, str(dev))
    assert finding.ok
