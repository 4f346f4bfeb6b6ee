"""`make setup` on a stock Mac: the Python it picks (scripts/find_python.py and `make check-python`), what it installs
(requirements.txt, the test extra, constraints.txt) and what macOS's GNU make 3.81 and bash 3.2 can run. No package
is installed here: the Python check stops before any install, and the rest reads files."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import tomllib
import unittest
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent


def script_module(name: str):
    """scripts/<name>.py as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


find_python = script_module("find_python")
constraint_lines = script_module("freeze_constraints").constraint_lines

MAKE = shutil.which("make")
PYENV_39 = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions" / "3.9.18" / "bin" / "python3.9"
# what `make setup` copies into a bare folder: the Makefile and the files its setup rule depends on
SETUP_FILES = ("Makefile", "requirements.txt", "requirements-test.txt", "constraints.txt", "pyproject.toml",
               "scripts/find_python.py", "scripts/install_openblas.sh")


def executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def fake_python(folder: Path, name: str, version: str = "3.9.6", status: int = 0) -> Path:
    """A `name` that answers --version like a Python of `version` (or exits `status`, like a pyenv shim of a
    version not selected) and runs anything else with this test's Python, so it can run the check itself."""
    if status:
        return executable(folder / name, f"#!/bin/sh\necho 'pyenv: {name}: command not found' >&2\nexit {status}\n")
    return executable(folder / name, f'#!/bin/sh\nif [ "$1" = --version ]; then echo "Python {version}"; exit 0; fi\n'
                                     f'exec "{sys.executable}" "$@"\n')


def one_line(test: unittest.TestCase, stderr: str, *words: str) -> str:
    """The check's message: one line of stderr (make may add its own `make: *** ...` line), naming `words`."""
    lines = [line for line in stderr.splitlines() if line and not re.match(r"make(\[\d+\])?: \*\*\*", line)]
    test.assertEqual(len(lines), 1, stderr)
    for word in words:
        test.assertIn(word, lines[0])
    return lines[0]


class FindPythonTest(unittest.TestCase):
    """The script alone, run by this test's Python with a PATH of fakes."""

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, self.tmp)
        self.bin = self.tmp / "bin"
        self.bin.mkdir()
        fake_python(self.bin, "python3")                            # macOS's Command Line Tools Python
        fake_python(self.bin, "python3.13", status=127)              # a pyenv shim of a version not selected

    def check(self, *args: str, path: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(ROOT / "scripts" / "find_python.py"), *args], capture_output=True,
                              text=True, timeout=60, env={**os.environ, "PATH": path or str(self.bin)})

    def test_a_python3_of_3_9_alone_stops_with_one_line(self):
        out = self.check()
        self.assertEqual((out.returncode, out.stdout), (1, ""))
        line = one_line(self, out.stderr, "3.11", "python3 is Python 3.9.6", "brew install python@3.12", "python.org")
        self.assertEqual(line, find_python.choose("", str(self.bin))[1])

    def test_the_newest_python3_1x_on_path_that_runs_is_picked_and_named(self):
        more = self.tmp / "more"
        more.mkdir()
        fake_python(more, "python3.11", "3.11.9")
        fake_python(more, "python3.12", "3.12.4")
        fake_python(more, "python3.14", "3.14.0")                  # newer than the tested ones: tried last
        out = self.check(path=f"{self.bin}{os.pathsep}{more}")
        self.assertEqual((out.returncode, out.stdout.strip()), (0, str(more / "python3.12")))
        one_line(self, out.stderr, f"using {more / 'python3.12'} (Python 3.12.4)")

    def test_a_python3_of_3_11_or_later_is_used_without_a_word(self):
        fake_python(self.bin, "python3", "3.11.7")
        out = self.check()
        self.assertEqual((out.returncode, out.stdout.strip(), out.stderr), (0, "python3", ""))

    def test_a_given_python_that_is_too_old_or_does_not_run_stops_with_one_line(self):
        out = self.check("--python", str(self.bin / "python3"))
        self.assertEqual((out.returncode, out.stdout), (1, ""))
        one_line(self, out.stderr, "3.11", f"PYTHON={self.bin / 'python3'} is Python 3.9.6", "brew install")
        out = self.check("--python", "python3.13")
        one_line(self, out.stderr, "3.11", "PYTHON=python3.13 does not run")
        fake_python(self.bin, "python3.12", "3.12.4")
        out = self.check("--python", "python3.12")                   # a given one is used as given, unnamed
        self.assertEqual((out.returncode, out.stdout.strip(), out.stderr), (0, "python3.12", ""))

    def test_an_existing_venv_is_reused_unless_its_python_is_too_old(self):
        venv = self.tmp / "venv"
        (venv / "bin").mkdir(parents=True)
        fake_python(venv / "bin", "python", "3.11.7")
        out = self.check("--venv", str(venv))
        self.assertEqual((out.returncode, out.stdout.strip()), (0, str(venv / "bin" / "python")))
        fake_python(venv / "bin", "python", "3.9.6")
        out = self.check("--venv", str(venv))
        self.assertEqual(out.returncode, 1)
        one_line(self, out.stderr, "3.11", "holds Python 3.9.6", "make clean-venv")

    @unittest.skipUnless(PYENV_39.exists(), f"no {PYENV_39} (pyenv's build of macOS's Python 3.9)")
    def test_a_real_python_3_9_runs_the_check_and_is_refused_as_PYTHON(self):
        out = subprocess.run([str(PYENV_39), str(ROOT / "scripts" / "find_python.py"), "--python", str(PYENV_39)],
                             capture_output=True, text=True, timeout=60, env={**os.environ, "PATH": str(self.bin)})
        self.assertEqual((out.returncode, out.stdout), (1, ""))
        one_line(self, out.stderr, "3.11", "is Python 3.9.18")


@unittest.skipUnless(MAKE, "no make")
class MakeSetupPythonTest(unittest.TestCase):
    """`make setup` and `make check-python` in a bare folder with no .venv, with a python3 of 3.9 first on PATH."""

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, self.tmp)
        self.repo, self.bin = self.tmp / "repo", self.tmp / "bin"
        for name in SETUP_FILES:
            (self.repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, self.repo / name)
        self.bin.mkdir()
        fake_python(self.bin, "python3")
        fake_python(self.bin, "python3.12", status=127)

    def make(self, *args: str, path: str | None = None) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES")}
        return subprocess.run([MAKE, "-s", *args], cwd=self.repo, capture_output=True, text=True, timeout=120,
                              env={**env, "PATH": path or str(self.bin)})     # as a user runs it, not under make

    def test_setup_with_only_a_python3_of_3_9_stops_with_one_line_and_no_venv(self):
        out = self.make("setup")
        self.assertNotEqual(out.returncode, 0)
        one_line(self, out.stderr, "needs Python 3.11 or later", "python3 is Python 3.9.6", "brew install")
        self.assertFalse((self.repo / ".venv").exists())

    def test_setup_given_PYTHON_of_3_9_stops_with_one_line_and_no_venv(self):
        out = self.make("setup", f"PYTHON={self.bin / 'python3'}")
        self.assertNotEqual(out.returncode, 0)
        one_line(self, out.stderr, "needs Python 3.11 or later", f"PYTHON={self.bin / 'python3'} is Python 3.9.6")
        self.assertFalse((self.repo / ".venv").exists())

    @unittest.skipUnless(PYENV_39.exists(), f"no {PYENV_39} (pyenv's build of macOS's Python 3.9)")
    def test_setup_with_a_real_python_3_9_as_python3_stops_with_one_line_and_no_venv(self):
        (self.bin / "python3").unlink()
        (self.bin / "python3").symlink_to(PYENV_39)
        out = self.make("setup")
        self.assertNotEqual(out.returncode, 0)
        one_line(self, out.stderr, "needs Python 3.11 or later", "python3 is Python 3.9.18", "brew install")
        self.assertFalse((self.repo / ".venv").exists())

    def test_check_python_picks_a_later_python_on_path_and_says_which(self):
        more = self.tmp / "more"
        more.mkdir()
        fake_python(more, "python3.11", "3.11.7")
        out = self.make("check-python", path=f"{self.bin}{os.pathsep}{more}")
        self.assertEqual((out.returncode, out.stdout.strip()), (0, str(more / "python3.11")))
        one_line(self, out.stderr, f"using {more / 'python3.11'}")
        self.assertFalse((self.repo / ".venv").exists())


def requirement_lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class InstallFilesTest(unittest.TestCase):
    def setUp(self):
        self.project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def test_the_default_install_leaves_the_test_extra_out(self):
        runtime = {canonical(Requirement(r).name) for r in requirement_lines(ROOT / "requirements.txt")}
        extra = [Requirement(r) for r in requirement_lines(ROOT / "requirements-test.txt")]
        self.assertEqual({canonical(r.name) for r in extra}, {"hypothesis", "llama-cpp-python"})
        self.assertFalse(runtime & {"hypothesis", "llama-cpp-python"})
        pin = re.search(r'LLAMA_CPP_PYTHON = "([^"]+)"', (ROOT / "scripts" / "llamacpp_check.py").read_text())[1]
        self.assertIn(pin, requirement_lines(ROOT / "requirements-test.txt"))     # the check's own pin

    def test_pyproject_lists_what_the_requirements_files_list(self):
        def same(lines):
            return sorted(str(Requirement(line)) for line in lines)
        self.assertEqual(same(self.project["dependencies"]), same(requirement_lines(ROOT / "requirements.txt")))
        self.assertEqual(same(self.project["optional-dependencies"]["test"]),
                         same(requirement_lines(ROOT / "requirements-test.txt")))
        self.assertEqual(self.project["requires-python"], ">=%d.%d" % find_python.NEED)

    def test_make_installs_with_the_constraints_and_the_test_extra_for_the_tests(self):
        makefile = (ROOT / "Makefile").read_text()
        self.assertIn("PIP_INSTALL = $(PY) -m pip install --quiet -c constraints.txt", makefile)
        self.assertIn("\t$(PIP_INSTALL) -r requirements.txt\n", makefile)
        self.assertRegex(makefile, r'\tCMAKE_ARGS="\$\$\{CMAKE_ARGS:--DLLAMA_CURL=OFF\}" \$\(PIP_INSTALL\) '
                                   r'-r requirements-test\.txt\n\ttouch \$\(TEST_STAMP\)')
        for target in ("test", "llamacpp-check"):
            self.assertRegex(makefile, rf"(?m)^{target}: setup \$\(TEST_STAMP\)$")
        self.assertRegex(makefile, r"(?m)^\$\(STAMP\): requirements\.txt constraints\.txt pyproject\.toml$")

    def test_the_makefile_keeps_to_gnu_make_3_81(self):
        """macOS's make is 3.81: none of the features that came later (checked by reading; Linux has 4.3)."""
        later = {r"^\.ONESHELL": "3.82", r"\$\(file ": "4.0", r"^\s*[\w.]+\s*!=": "4.0", r"::=": "3.82 (POSIX)",
                 r"&:": "4.3", r"^\s*undefine\b": "3.82", r"^\.RECIPEPREFIX": "3.82", r"^\s*private\b": "3.82",
                 r"\$\((guile|let|intcmp) ": "4.0-4.4", r"^-?load\b": "4.0"}
        makefile = "\n".join(line for line in (ROOT / "Makefile").read_text().splitlines()
                             if not line.lstrip().startswith("#"))
        for pattern, version in later.items():
            self.assertIsNone(re.search(pattern, makefile, flags=re.M), f"Makefile uses make {version}: {pattern}")


class ConstraintsTest(unittest.TestCase):
    def setUp(self):
        self.text = (ROOT / "constraints.txt").read_text()
        self.pins = {}
        for line in requirement_lines(ROOT / "constraints.txt"):
            self.assertRegex(line, r"^[A-Za-z0-9][\w.-]*==[\w.+!]+$")            # a plain pin, no URL or marker
            name, version = line.split("==")
            self.pins[canonical(name)] = version

    def test_it_says_how_it_was_made_and_pins_the_hub_packages(self):
        self.assertTrue(self.text.startswith("# Made by `make constraints`"))
        for name in ("transformers", "huggingface-hub", "mlx", "mlx-lm", "numpy"):
            self.assertIn(name, self.pins)

    def test_it_pins_nothing_a_mac_cannot_install(self):
        """mlx-cpu is mlx[cpu]'s Linux backend (a Mac's mlx carries Metal); CUDA wheels are Linux only."""
        linux_only = [name for name in self.pins if name == "mlx-cpu" or name.startswith(("nvidia-", "mlx-cuda"))]
        self.assertEqual(linux_only, [])

    def test_every_requirement_accepts_its_pinned_version(self):
        for path in ("requirements.txt", "requirements-test.txt"):
            for line in requirement_lines(ROOT / path):
                requirement = Requirement(line)
                with self.subTest(requirement=line):
                    name = canonical(requirement.name)
                    self.assertIn(name, self.pins)
                    self.assertTrue(requirement.specifier.contains(self.pins[name], prereleases=True))

    def test_the_freeze_drops_the_project_urls_and_mlx_cpu(self):
        freeze = ("# Editable Git install with no remote (wordle-mlx==0.1.0)\n-e /work/main\nmlx==0.32.4\n"
                  "mlx-cpu==0.32.4\npyflakes @ file:///tmp/pyflakes-4.1.0-py2.py3-none-any.whl\nNumpy==2.4.6\n"
                  "huggingface_hub==2.4.0\n")
        self.assertEqual(constraint_lines(freeze), ["huggingface_hub==2.4.0", "mlx==0.32.4", "Numpy==2.4.6"])


# "${a[@]}" or "${a[*]}" not in the guarded form ${a[@]+"${a[@]}"}: bash 3.2 stops on it under set -u when a is empty
GUARDED = re.compile(r'\$\{(\w+)\[([@*])\]\+"\$\{\1\[\2\]\}"\}')
EXPANSION = re.compile(r"\$\{\w+\[[@*]\]\}")


def unguarded_arrays(text: str) -> list[str]:
    """The lines of a script with such an expansion outside a comment."""
    return [line.strip() for line in text.splitlines()
            if EXPANSION.search(GUARDED.sub("", re.sub(r"(^|\s)#.*$", "", line)))]


class ShellScriptsTest(unittest.TestCase):
    def scripts(self) -> list[Path]:
        listed = subprocess.run(["git", "ls-files", "*.sh"], cwd=ROOT, capture_output=True, text=True)
        names = listed.stdout.split() if listed.returncode == 0 else []
        found = [ROOT / name for name in names if (ROOT / name).is_file()] or sorted(ROOT.glob("scripts/*.sh"))
        self.assertIn(ROOT / "scripts" / "demo.sh", found)
        return found

    def test_no_script_expands_an_array_that_bash_3_2_refuses_when_empty(self):
        for script in self.scripts():
            with self.subTest(script=script.name):
                self.assertEqual(unguarded_arrays(script.read_text()), [])

    def test_the_check_finds_an_unguarded_expansion(self):
        script = 'cmd "${flags[@]}"\ncmd ${flags[@]+"${flags[@]}"}  # not "${flags[@]}"\nx=("${a[*]}")\nn=${#a[@]}\n'
        self.assertEqual(unguarded_arrays(script), ['cmd "${flags[@]}"', 'x=("${a[*]}")'])


if __name__ == "__main__":
    unittest.main()
