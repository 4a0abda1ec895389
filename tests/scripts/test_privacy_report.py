"""scripts/privacy_report.py works without any ML framework."""
import shlex
import subprocess
import sys

from conftest import REPO, ledger_event, save_model

SCRIPT = REPO / "scripts" / "privacy_report.py"
FRAMEWORK_MODULES = ("torch", "opacus", "tensorflow", "tensorflow_privacy", "mindspore",
                     "mindarmour")
# Run the script with every ML framework made unimportable (an import hook that refuses them).
WITHOUT_FRAMEWORKS = ("import runpy, sys\n"
                      "class Refuse:\n"
                      "    def find_spec(self, name, path=None, target=None):\n"
                      f"        if name.split('.')[0] in {FRAMEWORK_MODULES!r}:\n"
                      "            raise ImportError(f'{name} is not installed here')\n"
                      "sys.meta_path.insert(0, Refuse())\n"
                      "sys.argv = sys.argv[1:]\n"
                      "runpy.run_path(sys.argv[0], run_name='__main__')\n")

def run(*args, cwd):
    return subprocess.run([sys.executable, "-c", WITHOUT_FRAMEWORKS, str(SCRIPT), *map(str, args)],
                          capture_output=True, text=True, cwd=cwd)


def test_prints_the_statement_of_a_model_file_without_any_framework(tmp_path):
    event = ledger_event("mindspore", ("fp",), n=4000, batch_size=500, sigma=2.867, epochs=30)
    path = save_model(tmp_path / "model", [event])
    proc = run(path, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"# {path} (mindspore)" in proc.stdout and "**(ε, δ) = (2.998, 1e-05)**" in proc.stdout


def test_bad_model_file_is_one_line(tmp_path):
    (tmp_path / "junk").write_bytes(b"junk")
    proc = run(tmp_path / "junk", cwd=tmp_path)
    assert (proc.returncode == 2 and proc.stderr.startswith("error: ")
            and "not a valid model file" in proc.stderr)
    assert "--help" not in proc.stderr and "model files" in run("--help", cwd=tmp_path).stdout


def test_a_folder_or_an_edited_ledger_is_one_line(tmp_path):
    import json
    import zipfile

    proc = run(tmp_path, cwd=tmp_path)
    assert (proc.returncode == 2
            and proc.stderr == f"error: {tmp_path}: is a folder; give the path of a model file\n")
    path = save_model(tmp_path / "model",
                      [ledger_event("torch", n=4000, batch_size=500, sigma=2.867, epochs=30)])
    for steps in (-5, "2", 1):
        with zipfile.ZipFile(path) as archive:
            members = {name: archive.read(name) for name in archive.namelist()}
        ledger = json.loads(members["ledger.json"])
        ledger["events"][0]["steps"] = steps
        members["ledger.json"] = json.dumps(ledger).encode()
        with zipfile.ZipFile(tmp_path / "edited", "w") as archive:
            for name, content in members.items():
                archive.writestr(name, content)
        proc = run(tmp_path / "edited", cwd=tmp_path)
        assert (proc.returncode == 2 and proc.stdout == ""
                and proc.stderr.count("\n") == 1), proc.stderr
        assert "its ledger does not match the sha256 recorded in its metadata" in proc.stderr


def test_piped_into_head_it_stops_quietly(tmp_path):
    """`| head -1` closes the pipe after one line: normal use, so no traceback, and the status of a
    tool that SIGPIPE ended. Forty statements (about 130 kB) are more than a pipe holds, so a write
    surely meets the closed pipe."""
    path = save_model(tmp_path / "model", [ledger_event()])
    command = (f"{shlex.quote(sys.executable)} {shlex.quote(str(SCRIPT))} "
               f"{' '.join([shlex.quote(str(path))] * 40)}")
    proc = subprocess.run(["bash", "-c", command + " | head -1; exit ${PIPESTATUS[0]}"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert (proc.stdout, proc.stderr, proc.returncode) == (f"# {path} (torch)\n", "", 141)
