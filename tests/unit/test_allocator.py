"""``allocator:``: the file's forms and their errors, the library's search, the ids, the
family key, the job's environment, and what the child records and notes.

The real run under jemalloc is tests/e2e/test_allocator.py.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.cli.app import main
from orchestrator.config import allocator as config_allocator
from orchestrator.config.allocator import find_library, parse_ldconfig
from orchestrator.contract.allocators import Allocator, fixed_threshold, setting_allowed
from orchestrator.contract.errors import ConfigError
from orchestrator.contract.spec import RunSpec
from orchestrator.job.command import job_env
from orchestrator.matrix.experiment import Experiment
from orchestrator.matrix.launches import families, family_key
from trainer_entry.measure.hostallocator import (
    SHARED_HEAP_NOTE,
    allocator_of,
    in_force,
    settings_of,
    shared_heap_note,
)

BASE = """
matrix:
  effective_batch_size: [2]
  max_seq_len: [128]
scenarios:
  - name: plain
    device: cpu
    arguments: {model_name_or_path: tiny-llama}
"""

THRESHOLDS = "{MALLOC_MMAP_THRESHOLD_: 4294967296, MALLOC_TRIM_THRESHOLD_: 4294967296}"


def _with(scenario_key: str = "", top: str = "") -> str:
    """BASE with a second scenario ``tuned`` (``scenario_key`` under it) and ``top`` first."""
    return (
        top
        + BASE
        + "  - name: tuned\n    device: cpu\n"
        + "".join(f"    {line}\n" for line in scenario_key.splitlines())
        + "    arguments: {model_name_or_path: tiny-llama}\n"
    )


@pytest.fixture
def fake_library(tmp_path: Path) -> Path:
    """A file that stands for jemalloc's library (nothing loads it in these tests)."""
    path = tmp_path / "lib" / "libjemalloc.so.2"
    path.parent.mkdir()
    path.write_bytes(b"")
    return path


def _cells(plan: Callable[..., object], text: str) -> dict[str, Experiment]:
    result = plan(text, device="cpu")
    return {e.scenario: e for e in result.experiments}  # type: ignore[attr-defined]


def _error(load: Callable[..., object], text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load(text)
    message = str(info.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------------------
# The file's forms


def test_the_mapping_form_resolves_settings_to_strings(load) -> None:
    config = load(_with(f"allocator:\n  name: glibc\n  settings: {THRESHOLDS}"))
    plain, tuned = config.scenarios
    assert plain.allocator is None
    assert tuned.allocator == Allocator(
        name="glibc",
        settings={"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "4294967296"},
    )


def test_the_shorthand_and_a_library_relative_to_the_file(load, fake_library: Path) -> None:
    config = load(_with(top="allocator:\n  name: jemalloc\n  library: lib/libjemalloc.so.2\n"))
    # the file's allocator is every scenario's that names none
    assert {s.allocator for s in config.scenarios} == {
        Allocator(name="jemalloc", library=str(fake_library.resolve()))
    }
    config = load(_with("allocator: glibc", top="allocator: {settings: {MALLOC_ARENA_MAX: 2}}\n"))
    plain, tuned = config.scenarios
    assert plain.allocator == Allocator(settings={"MALLOC_ARENA_MAX": "2"})
    assert tuned.allocator == Allocator(name="glibc")  # its own: the defaults


def test_a_bad_name_is_one_line_at_its_key(load) -> None:
    message = _error(load, _with("allocator: jemaloc"))
    assert "scenarios.yaml:10: scenarios[1].allocator: input should be 'glibc', 'jemalloc'" in (
        message
    )
    assert "(got a string 'jemaloc')" in message
    message = _error(load, _with("allocator: {name: glibc, setings: {}}"))
    assert "unknown key 'setings'; allowed: name, library, settings" in message


@pytest.mark.parametrize(
    ("allocator", "setting", "allowed"),
    [
        ("glibc", "TCMALLOC_RELEASE_RATE", "glibc reads MALLOC_* and GLIBC_TUNABLES"),
        (
            "glibc",
            "MALLOC_CONF",
            "glibc reads MALLOC_* and GLIBC_TUNABLES (MALLOC_CONF is jemalloc's)",
        ),
        ("jemalloc", "MALLOC_ARENA_MAX", "jemalloc reads MALLOC_CONF and _RJEM_MALLOC_CONF"),
        ("tcmalloc", "MALLOC_CONF", "tcmalloc reads TCMALLOC_*"),
    ],
)
def test_a_setting_of_another_allocator_is_refused_at_its_line(
    load, fake_library: Path, allocator: str, setting: str, allowed: str
) -> None:
    library = f", library: {fake_library}" if allocator != "glibc" else ""
    text = _with(f"allocator: {{name: {allocator}{library}, settings: {{{setting}: '1'}}}}")
    message = _error(load, text)
    assert f"scenarios.yaml:10: scenarios[1].allocator.settings.{setting}: " in message
    assert f"'{setting}' is not a setting of {allocator}; {allowed}" in message


def test_a_library_that_is_not_there_is_refused(load, tmp_path: Path) -> None:
    message = _error(load, _with("allocator: {name: jemalloc, library: nowhere/libjemalloc.so}"))
    assert "scenarios.yaml:10: scenarios[1].allocator.library: jemalloc library " in message
    assert f"no such file (a relative path is relative to {tmp_path})" in message
    message = _error(load, _with(f"allocator: {{name: glibc, library: {tmp_path}}}"))
    assert "library applies to jemalloc and tcmalloc" in message


def test_an_allocator_not_installed_says_what_to_install(load, monkeypatch) -> None:
    monkeypatch.setattr(config_allocator, "find_library", lambda name: None)
    message = _error(load, _with(top="allocator: tcmalloc\n"))
    assert "scenarios.yaml:1: allocator: tcmalloc is not installed on this machine" in message
    assert "install it (apt-get install libtcmalloc-minimal4) or give its path as library:" in (
        message
    )


def test_the_finder_looks_in_ldconfig_then_the_folders(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir(), second.mkdir()
    assert find_library("tcmalloc", dirs=[str(first)], listed={}) is None
    (second / "libtcmalloc_minimal.so.4").write_bytes(b"")
    (first / "libtcmalloc.so").write_bytes(b"")
    # the preferred name first, wherever it is
    dirs = [str(first), str(second)]
    assert find_library("tcmalloc", dirs=dirs, listed={}) == str(
        second / "libtcmalloc_minimal.so.4"
    )
    listed = {"libtcmalloc.so.4": str(first / "libtcmalloc.so")}
    assert find_library("tcmalloc", dirs=dirs, listed=listed) == str(first / "libtcmalloc.so")
    # a listing of a file that is gone is passed over
    assert find_library("jemalloc", dirs=[], listed={"libjemalloc.so.2": "/gone.so"}) is None


def test_ldconfig_lines_prefer_this_word_size() -> None:
    text = (
        "3 libs found in cache `/etc/ld.so.cache'\n"
        "\tlibjemalloc.so.2 (libc6) => /usr/lib32/libjemalloc.so.2\n"
        "\tlibjemalloc.so.2 (libc6,x86-64) => /lib/x86_64-linux-gnu/libjemalloc.so.2\n"
        "\tlibc.so.6 (libc6,x86-64, OS ABI: Linux 3.2.0) => /lib/x86_64-linux-gnu/libc.so.6\n"
    )
    assert parse_ldconfig(text) == {
        "libjemalloc.so.2": "/lib/x86_64-linux-gnu/libjemalloc.so.2",
        "libc.so.6": "/lib/x86_64-linux-gnu/libc.so.6",
    }
    assert parse_ldconfig(text, wide=False)["libjemalloc.so.2"] == "/usr/lib32/libjemalloc.so.2"


def test_the_settings_each_allocator_reads() -> None:
    assert setting_allowed("glibc", "MALLOC_MMAP_THRESHOLD_")
    assert setting_allowed("glibc", "GLIBC_TUNABLES")
    assert not setting_allowed("glibc", "GLIBC_TUNABLES_X")
    assert setting_allowed("jemalloc", "_RJEM_MALLOC_CONF")
    assert setting_allowed("tcmalloc", "TCMALLOC_RELEASE_RATE")
    assert not setting_allowed("tcmalloc", "LD_PRELOAD")


# ---------------------------------------------------------------------------
# Ids, specs and launches


def test_ids_change_only_where_an_allocator_is_named(plan) -> None:
    before = _cells(plan, BASE)["plain"]
    after = _cells(plan, _with(f"allocator: {{settings: {THRESHOLDS}}}"))
    # the scenario without one keeps its id and its spec, byte for byte
    assert after["plain"].experiment_id == before.experiment_id
    assert after["plain"].spec() == before.spec() and "allocator" not in before.spec()
    tuned = after["tuned"]
    assert tuned.experiment_id.startswith("tuned.tiny-llama.none.g1.eb2-")
    other = _cells(plan, _with("allocator: {settings: {MALLOC_ARENA_MAX: 2}}"))["tuned"]
    assert len({tuned.experiment_id, other.experiment_id}) == 2
    assert tuned.cell_id == tuned.experiment_id  # its first repeat's, as ever
    spec = RunSpec(**tuned.spec())
    assert spec.allocator == tuned.allocator
    assert spec.model_dump(mode="json")["allocator"] == {
        "name": "glibc",
        "library": None,
        "settings": {
            "MALLOC_MMAP_THRESHOLD_": "4294967296",
            "MALLOC_TRIM_THRESHOLD_": "4294967296",
        },
    }


def test_the_id_names_the_library_by_its_file_only() -> None:
    here = Allocator(name="jemalloc", library="/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
    there = Allocator(name="jemalloc", library="/usr/lib64/libjemalloc.so.2")
    assert here.identity() == there.identity()


def test_a_family_is_split_by_its_allocator(plan, fake_library: Path) -> None:
    text = _with("allocator: {name: jemalloc, library: lib/libjemalloc.so.2}")
    cells = list(plan(text, device="cpu").experiments)
    assert len(cells) == 2
    assert family_key(cells[0]) != family_key(cells[1])
    assert len(families(cells)) == 2
    same = list(plan(_with(), device="cpu").experiments)
    assert len(families(same)) == 1  # without it the two cells share a launch


# ---------------------------------------------------------------------------
# The job's environment


def test_job_env_sets_glibc_settings(plan) -> None:
    tuned = _cells(plan, _with(f"allocator: {{settings: {THRESHOLDS}}}"))["tuned"]
    env = job_env(tuned, [], inherited={"LD_PRELOAD": "/opt/mine.so"})
    assert env["MALLOC_MMAP_THRESHOLD_"] == env["MALLOC_TRIM_THRESHOLD_"] == "4294967296"
    assert "LD_PRELOAD" not in env  # glibc preloads nothing: the parent's reaches the job


def test_job_env_preloads_ahead_of_what_is_preloaded(plan, fake_library: Path) -> None:
    text = _with(
        "allocator: {name: jemalloc, library: lib/libjemalloc.so.2, settings: "
        "{MALLOC_CONF: 'background_thread:true'}}"
    )
    cells = _cells(plan, text)
    library = str(fake_library.resolve())
    env = job_env(cells["tuned"], [], inherited={"LD_PRELOAD": "/opt/mine.so"})
    assert env["LD_PRELOAD"] == f"{library}:/opt/mine.so"
    assert env["MALLOC_CONF"] == "background_thread:true"
    assert job_env(cells["tuned"], [], inherited={})["LD_PRELOAD"] == library
    # already preloaded: named once
    again = job_env(cells["tuned"], [], inherited={"LD_PRELOAD": f"{library} /opt/mine.so"})
    assert again["LD_PRELOAD"] == f"{library}:/opt/mine.so"
    # a cell without allocator: sets none of it, the parent's environment reaches the job
    assert "LD_PRELOAD" not in job_env(cells["plain"], [], inherited={"LD_PRELOAD": "/x.so"})


def test_plan_commands_show_the_allocators_variables(
    capsys, config_dir: Path, write: Callable[[str, str], Path]
) -> None:
    path = write(
        "scenarios.yaml",
        _with("allocator: {settings: {MALLOC_MMAP_THRESHOLD_: 4294967296}}"),
    )
    argv = ["plan", "--scenarios", str(path), "--defaults", str(config_dir / "defaults.yaml")]
    code = main([*argv, "--device", "cpu", "--commands", "--results", "res"])
    out, err = capsys.readouterr()
    assert code == 0, err
    commands = [shlex.split(line) for line in out.splitlines() if line.startswith("env ")]
    by_spec = {words[-1]: words for words in commands}
    tuned = next(words for spec, words in by_spec.items() if "/tuned." in spec)
    plain = next(words for spec, words in by_spec.items() if "/plain." in spec)
    assert "MALLOC_MMAP_THRESHOLD_=4294967296" in tuned
    assert not any(word.startswith("MALLOC_") for word in plain)


# ---------------------------------------------------------------------------
# What the child records

MAPS = """\
55d0a0000000-55d0a0001000 r--p 00000000 08:01 123    /usr/bin/python3.11
7f0000000000-7f0000100000 r-xp 00000000 08:01 456    /usr/lib/x86_64-linux-gnu/libjemalloc.so.2
7f1000000000-7f1000200000 r-xp 00028000 08:01 789    /usr/lib/x86_64-linux-gnu/libc.so.6
7f2000000000-7f2000010000 r-xp 00000000 08:01 790    /opt/lib/libmimalloc.so.2 (deleted)
7f3000000000-7f3000001000 rw-p 00000000 00:00 0
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0      [stack]
"""
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"


def test_the_allocator_is_the_library_that_serves_malloc() -> None:
    assert allocator_of(MAPS, 0x7F0000000100, "glibc 2.36") == f"jemalloc {JEMALLOC}"
    # jemalloc mapped, but malloc is the C library's (a library loaded it, no preload)
    assert allocator_of(MAPS, 0x7F1000000100, "glibc 2.36") == "glibc 2.36"
    assert allocator_of(MAPS, 0x7F2000000100, "glibc 2.36") == (
        "mimalloc /opt/lib/libmimalloc.so.2"
    )
    # no address: a mapped preloadable allocator, else the C library
    assert allocator_of(MAPS, None, "glibc 2.36") == f"jemalloc {JEMALLOC}"
    without = "\n".join(line for line in MAPS.splitlines() if "jemalloc" not in line)
    assert allocator_of(without, None, "glibc 2.36") == "glibc 2.36"
    assert allocator_of("", None, None) is None


def test_the_settings_in_force_are_the_allocator_variables_sorted() -> None:
    environ = {
        "MALLOC_TRIM_THRESHOLD_": "1",
        "GLIBC_TUNABLES": "glibc.malloc.arena_max=2",
        "LD_PRELOAD": "/x.so",
        "TCMALLOC_RELEASE_RATE": "0",
        "_RJEM_MALLOC_CONF": "narenas:1",
        "OMP_NUM_THREADS": "2",
    }
    assert settings_of(environ) == (
        "GLIBC_TUNABLES=glibc.malloc.arena_max=2; MALLOC_TRIM_THRESHOLD_=1; "
        "TCMALLOC_RELEASE_RATE=0; _RJEM_MALLOC_CONF=narenas:1"
    )
    assert settings_of({"PATH": "/bin"}) is None


def test_this_process_is_read() -> None:
    allocator, settings = in_force({"MALLOC_ARENA_MAX": "2"})
    assert allocator is not None and allocator.split()[0] in ("glibc", "jemalloc", "tcmalloc")
    assert settings == "MALLOC_ARENA_MAX=2"


def test_a_later_run_of_a_launch_is_noted_under_a_dynamic_threshold() -> None:
    assert shared_heap_note("glibc 2.36", {}) == SHARED_HEAP_NOTE
    assert "host_page_faults_per_step" in SHARED_HEAP_NOTE and "please" not in SHARED_HEAP_NOTE
    assert shared_heap_note("glibc 2.36", {"MALLOC_ARENA_MAX": "2"}) == SHARED_HEAP_NOTE
    tunables = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    assert shared_heap_note("glibc 2.36", tunables) == SHARED_HEAP_NOTE
    # a fixed threshold, as a variable or a tunable (any of glibc's four fixes it)
    assert shared_heap_note("glibc 2.36", {"MALLOC_MMAP_THRESHOLD_": "4294967296"}) is None
    assert shared_heap_note("glibc 2.36", {"MALLOC_TOP_PAD_": "0"}) is None
    fixed = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.mmap_threshold=65536"}
    assert fixed_threshold(fixed) and shared_heap_note("glibc 2.36", fixed) is None
    # another allocator, or none known: no glibc threshold to speak of
    assert shared_heap_note(f"jemalloc {JEMALLOC}", {}) is None
    assert shared_heap_note(None, {}) is None


def test_between_runs_returns_the_note(monkeypatch) -> None:
    from trainer_entry.run import train

    for name in list(os.environ):
        if name.startswith(("MALLOC_", "GLIBC_TUNABLES")):
            monkeypatch.delenv(name)
    monkeypatch.setattr(train, "in_force", lambda: ("glibc 2.36", None))
    assert train.between_runs() == [SHARED_HEAP_NOTE]
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "4294967296")
    assert train.between_runs() == []
