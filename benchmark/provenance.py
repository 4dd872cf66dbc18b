"""Where a result came from: the command that made it, the code (git sha, dirty flag, diff) and
the machine (Python and package versions, CPU and GPU models), as MLflow tags; and the code of
another commit checked out beside this one (``worktree``), which ``fingerprint --at`` and
``reproduce --at-recorded-commit`` run a commit's own code in."""

from __future__ import annotations

import contextlib
import functools
import getpass
import importlib.metadata
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from agents.errors import ConfigError
from agents.settings import cpu_info

PACKAGES = ("torch", "numpy", "gymnasium", "mujoco", "mlflow", "optuna")
"""The packages whose versions decide the numbers."""


def command_line(argv: list[str] | None = None) -> str:
    """The command that started this process, as one would type it again: ``python -m
    benchmark run ...`` rather than the path of ``benchmark/__main__.py``."""
    argv = list(sys.argv if argv is None else argv)
    if not argv:
        return ""
    return " ".join([_program(argv[0]), *map(shlex.quote, argv[1:])])


def _program(path: str) -> str:
    program = Path(path)
    if program.name == "__main__.py" and program.parent.name == "benchmark":
        return "python -m benchmark"
    if program.name == "reprorl":
        return "reprorl"
    return shlex.quote(path)


@functools.lru_cache(maxsize=4)
def source_tags(command: str | None = None) -> dict[str, str]:
    """MLflow's standard source tags (what the UI shows as the run's source, user and commit) of
    the launch's ``command`` (default: this process's), e.g. ``python -m benchmark run``."""
    words = shlex.split(command if command is not None else command_line()) or ["reprorl"]
    head = 4 if words[:3] == ["python", "-m", "benchmark"] else 2
    tags = {"mlflow.source.type": "LOCAL", "mlflow.source.name": " ".join(words[:head])}
    try:
        tags["mlflow.user"] = getpass.getuser()
    except (KeyError, OSError):
        pass
    sha = code_version()["git_sha"]
    if sha != "unknown":
        tags["mlflow.source.git.commit"] = sha
    return tags


@functools.lru_cache(maxsize=1)
def code_version() -> dict[str, str]:
    """git sha and dirty flag of the working tree (``unknown`` outside a git checkout)."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=True).stdout.strip()

    try:
        sha = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return {"git_sha": "unknown", "git_dirty": "unknown"}
    return {"git_sha": sha, "git_dirty": str(dirty).lower()}


def git_diff(root: Path | None = None) -> str:
    """``git diff HEAD`` of the working tree (what a dirty run ran that the sha does not say);
    untracked files are not code the run imported, and do not count as dirty either."""
    root = root or Path(__file__).resolve().parent.parent
    try:
        return subprocess.run(["git", "diff", "HEAD"], cwd=root, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU (read once per process): its model name, and on Linux its family, model and widest vector unit, e.g.
    'AMD EPYC (family 25, model 1, AVX2)'. A cloud VM's model name can stand for several
    CPUs ('AMD EPYC' for Milan and Genoa), whose speeds and float kernels (AVX-512 or not) differ."""
    name = cpu_info("model name") or "unknown"
    family, model = cpu_info("cpu family"), cpu_info("model\t")
    if not family.isdigit() or not model.isdigit():
        return name
    flags = set(cpu_info("flags").split())
    vector = next((label for flag, label in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX")) if flag in flags), "")
    return f"{name} (family {family}, model {model}{', ' + vector if vector else ''})"


def gpu_models() -> str:
    """Names of the visible CUDA devices ('none' without CUDA); torch is imported only if loaded."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return "none"
    return "; ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))


def kernel_tags() -> dict[str, str]:
    """What sets the last bits of a run's numbers, once this process has loaded the networks
    (else nothing): ``cpu_gemm``, the CPU kernel of the networks' large layers
    (``agents.nets.gemm``), and ``critics``, how a run alone evaluates a critic ensemble
    (``REPRORL_CRITICS``: 'auto' stacks it on a GPU only)."""
    gemm = sys.modules.get("agents.nets.gemm")
    if gemm is None:
        return {}
    from agents import settings

    return {"cpu_gemm": gemm.kernel(), "critics": settings.critic_layout()}


@functools.lru_cache(maxsize=1)
def environment_tags() -> dict[str, str]:
    """Versions of Python and of the packages that decide the numbers, and the CPU/GPU models."""
    tags = {
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "gpu_model": gpu_models(),
    }
    for package in PACKAGES:
        try:
            tags[f"version.{package}"] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            tags[f"version.{package}"] = "not installed"
    return tags


# ------------------------------------------------------------------------------------ other commits


def git(repository: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(repository), *arguments], capture_output=True, text=True, check=False)


def repository() -> Path:
    """The git checkout this code runs from."""
    here = Path(__file__).resolve().parent
    found = git(here, "rev-parse", "--show-toplevel")
    if found.returncode != 0:
        raise ConfigError(f"{here} is not inside a git checkout: another commit's code cannot be checked out")
    return Path(found.stdout.strip())


def commit(repository: Path, name: str) -> str:
    """The full sha of commit ``name``; ConfigError when the repository has no such commit."""

    found = git(repository, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{name}^{{commit}}") if name.strip() else None
    if found is None or found.returncode != 0:
        raise ConfigError(f"unknown commit {name!r}: {repository} has no such commit (a sha, tag or branch; `git fetch` one from elsewhere first)")
    return found.stdout.strip()


def commit_url_template(repository: Path | None = None) -> str | None:
    """'https://host/owner/name/commit/{sha}' for the checkout's ``origin`` remote when it is a
    web-hosted one (https, or git@host:owner/name), so a report can link each run's commit; None
    without such a remote (a commit is then named, not linked)."""
    try:
        where = repository if repository is not None else Path(__file__).resolve().parent
        url = git(where, "remote", "get-url", "origin").stdout.strip()
    except OSError:  # no git at all
        return None
    match = re.fullmatch(r"(?:https://([^/\s]+)/|git@([^:\s]+):)([^\s]+?)(?:\.git)?/?", url)
    if match is None:
        return None
    host = match.group(1) or match.group(2)
    return f"https://{host}/{match.group(3)}/commit/{{sha}}"


@contextlib.contextmanager
def worktree(repository: Path, sha: str) -> Iterator[Path]:
    """A temporary detached worktree of ``sha``, removed on the way out, whatever happens."""
    parent = Path(tempfile.mkdtemp(prefix="reprorl-worktree-"))
    tree = parent / f"at-{sha[:12]}"
    try:
        added = git(repository, "worktree", "add", "--detach", "--quiet", str(tree), sha)
        if added.returncode != 0:
            raise ConfigError(f"git worktree add {sha[:7]} failed: {' '.join(added.stderr.split())}")
        yield tree
    finally:
        if git(repository, "worktree", "remove", "--force", str(tree)).returncode != 0 and tree.exists():
            _forget(repository, tree)
        shutil.rmtree(parent, ignore_errors=True)


def _forget(repository: Path, tree: Path) -> None:
    """Where ``git worktree remove`` failed: the checkout and git's record of it (only ours)."""
    shutil.rmtree(tree, ignore_errors=True)
    common = git(repository, "rev-parse", "--path-format=absolute", "--git-common-dir")
    if common.returncode != 0:
        return
    for record in (Path(common.stdout.strip()) / "worktrees").glob(f"{tree.name}*"):
        gitdir = record / "gitdir"
        if gitdir.is_file() and Path(gitdir.read_text().strip()).parent == tree:
            shutil.rmtree(record, ignore_errors=True)
