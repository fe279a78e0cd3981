"""A demo's output folder (``grpolab demo --out DIR``): the demo starts over in a folder it made itself,
and refuses any other folder that holds files, so another run's checkpoints are never deleted.

The demo configs used to set ``log.overwrite: true`` so that running ``make demo`` again starts over;
with ``--out`` naming another run's folder, that deleted its checkpoints. Now the demo writes a mark
(``.grpolab_demo``, holding which demo) into its folder; a folder with the same mark is the demo's own
earlier run, started over as before; a non-empty folder without it is refused with one line, unless
the caller passes ``log.overwrite=true`` (then its checkpoints are replaced, as for ``grpolab train``).
"""

from __future__ import annotations

from pathlib import Path

from grpolab.config import ConfigError

MARK = ".grpolab_demo"


def owner(run_dir: Path) -> str | None:
    """Which demo made ``run_dir`` (its mark), or None."""
    try:
        return (Path(run_dir) / MARK).read_text().strip() or None
    except OSError:
        return None


def claim(run_dir: Path | str, kind: str, *, overwrite: bool) -> None:
    """Make ``run_dir`` this demo's (``kind``: "demo" or "demo --agent"); ConfigError when it holds another run.

    ``overwrite``: the caller asked for log.overwrite=true explicitly."""
    run_dir = Path(run_dir)
    try:
        held = sorted(p.name for p in run_dir.iterdir()) if run_dir.is_dir() else []
    except OSError as err:
        raise ConfigError(f"--out {run_dir}: cannot read it ({err.strerror}); choose another --out") from err
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"--out {run_dir} is a file, not a folder; choose another --out")
    made_by = owner(run_dir)
    if held and made_by != kind and not overwrite:
        what = f"a run of `grpolab {made_by}`" if made_by else "files that no `grpolab " + kind + "` wrote"
        shown = ", ".join(held[:5]) + (", ..." if len(held) > 5 else "")
        raise ConfigError(
            f"--out {run_dir} holds {what} ({shown}); nothing was changed. Choose another --out (an empty or new "
            "folder), or pass log.overwrite=true to replace that run's checkpoints"
        )
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / MARK).write_text(kind + "\n")
    except OSError as err:
        raise ConfigError(f"--out {run_dir}: cannot write it ({err.strerror}); choose a writable folder") from err
