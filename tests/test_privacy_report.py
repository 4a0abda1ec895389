"""scripts/privacy_report.py works without any ML framework."""
import subprocess
import sys

from conftest import REPO
from mnist_dp import model_file, privacy

SCRIPT = REPO / "scripts" / "privacy_report.py"
FRAMEWORK_MODULES = ("torch", "opacus", "tensorflow", "tensorflow_privacy", "mindspore", "mindarmour")
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
    event = privacy.DpEvent("mindspore", ("fp",), 4000, 0.125, 2.867, 240, privacy.PER_EXAMPLE, 1.0)
    path = tmp_path / "model"
    model_file.save(path, model_file.ModelFile("mindspore", b"weights", privacy.Ledger([event]), {"delta": 1e-5}))
    proc = run(path, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"# {path} (mindspore)" in proc.stdout and "**(ε, δ) = (2.998, 1e-05)**" in proc.stdout


def test_bad_model_file_is_one_line(tmp_path):
    (tmp_path / "junk").write_bytes(b"junk")
    proc = run(tmp_path / "junk", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and "not a valid model file" in proc.stderr
    assert "--help" not in proc.stderr and "model file(s)" in run("--help", cwd=tmp_path).stdout
