"""What the command line says to a newcomer: hints for options named as other tools name them, the bare command,
and --version."""

import shlex
import shutil
import subprocess
import sys
from importlib import metadata

import pytest
from conftest import BIN, assert_refused

from hashdist.cli.hints import BORROWED


@pytest.mark.parametrize("command, given, meant", [
    (["evaluate", "data.zarr", "--out", "r"], ["--topk", "100"], "--k"),
    (["evaluate", "data.zarr", "--out", "r"], ["--top-k", "100"], "--k"),
    (["evaluate", "data.zarr", "--out", "r"], ["--topK=100"], "--k"),
    (["evaluate", "data.zarr", "--out", "r"], ["--top_k", "100"], "--k"),
    (["evaluate", "data.zarr", "--out", "r"], ["--cutoff", "100"], "--k"),
    (["evaluate", "data.zarr", "--out", "r"], ["--at", "100"], "--k"),
    (["evaluate", "data.zarr", "--out", "r"], ["--radii", "2"], "--radius"),
    (["evaluate", "data.zarr", "--out", "r"], ["--metric", "hamming"], "--distance"),
    (["evaluate", "data.zarr", "--out", "r"], ["--output-dir", "r"], "--out"),
    (["evaluate", "data.zarr", "--out", "r"], ["--force"], "--overwrite"),
    (["evaluate", "data.zarr", "--out", "r"], ["--n-jobs", "2"], "--threads"),
    (["compare", "--method", "a=a.zarr", "--out", "c"], ["--topk", "10"], "--k"),
    (["synth", "--out", "d.zarr"], ["--bits", "32"], "--nbits"),
    (["ingest", "--out", "d.zarr"], ["--code-length", "32"], "--nbits"),
    (["ingest", "--out", "d.zarr"], ["--ground-truth", "gt.npz"], "--query-relevant"),
    (["evaluate", "data.zarr", "--out", "r"], ["--tsak", "a->b"], "--task"),  # a typo: the closest spelling
])
def test_names_from_other_tools_are_answered_with_hashdists_option(capsys, command, given, meant):
    line = assert_refused(capsys, [*command, *given], "error: ")
    assert line.endswith(f"(did you mean {meant}?)"), line


def test_every_borrowed_name_points_to_an_option_of_some_command():
    from hashdist.cli import build_parser

    parser = build_parser()
    options = {flag for command in parser._subparsers._group_actions[0].choices.values()
               for flag in command._option_string_actions}
    assert set(BORROWED) <= options, set(BORROWED) - options
    borrowed = [alias for aliases in BORROWED.values() for alias in aliases]
    assert len(borrowed) == len(set(borrowed)) and not options & set(borrowed)


@pytest.mark.parametrize("given", [["--output", "r"], ["-o", "r"], ["--output=r"]])
def test_a_missing_option_given_by_another_name_is_pointed_at(capsys, given):
    line = assert_refused(capsys, ["evaluate", "data.zarr", *given], "required: --out")
    assert line.endswith(f"({given[0].split('=')[0]}: did you mean --out?)"), line


def test_several_unknown_options_each_get_their_hint_and_metrics_says_all_are_computed(capsys):
    line = assert_refused(capsys, ["evaluate", "d.zarr", "--out", "r", "--topk", "5", "--metrics", "map"],
                          "unrecognized arguments")
    assert "--topk: did you mean --k?" in line and "--metrics: every metric is computed" in line


def test_a_name_for_an_option_the_command_lacks_gets_no_wrong_hint(capsys):
    line = assert_refused(capsys, ["history", "h", "--bits", "32"], "unrecognized arguments")
    assert "did you mean" not in line, line


def _run(*argv):
    return subprocess.run([str(BIN / "hashdist"), *argv], capture_output=True, text=True, timeout=60)


def test_the_bare_command_lists_the_commands_with_their_examples():
    done = _run()
    assert done.returncode == 2 and "Traceback" not in done.stderr
    for line in ("hashdist synth --preset demo --out demo/data.zarr", "hashdist evaluate data.zarr --out report/",
                 "evaluate            compute every metric", "history "):
        assert line in done.stderr, done.stderr
    assert done.stderr.rstrip().endswith("hashdist: give a command (hashdist COMMAND --help for its options)")


def test_version_names_hashdist_and_what_computes_and_runs_the_numbers():
    done = _run("--version")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"hashdist {metadata.version('hashdist')}"
    for name in ("numpy", "numba", "zarr", "prefect", "dask"):
        assert f"  {name} {metadata.version(name)}" in lines


def test_version_loads_neither_prefect_nor_dask():
    script = ("import sys; from hashdist.cli import main\ntry: main(['--version'])\nexcept SystemExit: pass\n"
              "print(sorted({m.split('.')[0] for m in sys.modules} & {'prefect', 'dask', 'distributed'}))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout + done.stderr


CI_VARIABLES = ("CI", "GITHUB_ACTIONS", "GITLAB_CI", "JENKINS_URL", "TRAVIS", "CIRCLECI", "BUILDKITE", "TF_BUILD",
                "CODEBUILD_BUILD_ID", "BITBUCKET_COMMIT", "TEAMCITY_VERSION", "DRONE", "SEMAPHORE", "APPVEYOR",
                "BUDDY", "CI_NAME")  # Prefect announces nothing where one is set: the test would pass whatever


@pytest.mark.skipif(shutil.which("script") is None, reason="util-linux's script (a terminal for the run) is missing")
def test_a_first_run_in_a_terminal_prints_no_usage_data_notice(class_dataset, tmp_path, cli_env):
    """With a fresh PREFECT_HOME, under a terminal, neither the CLI nor its temporary API server prints Prefect's
    first-run telemetry notice (the server's environment says DO_NOT_TRACK and no server analytics)."""
    env = {k: v for k, v in cli_env.items() if k not in ("DO_NOT_TRACK", "PREFECT_SERVER_ANALYTICS_ENABLED",
                                                         *CI_VARIABLES)}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    command = shlex.join([str(BIN / "hashdist"), "evaluate", str(class_dataset), "--out", str(tmp_path / "r"),
                          "--no-html", "--workers", "1", "--threads", "1"])
    done = subprocess.run(["script", "-qec", command, "/dev/null"], env=env, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "mAP" in done.stdout  # the run's table came through the terminal
    assert "usage data" not in done.stdout + done.stderr and "telemetry" not in done.stdout + done.stderr
