"""What the command line answers to an option it does not know: the option a name from another tool stands for
(``--topk`` is ``--k``), else the closest spelling; and ``--version``, the versions of what runs the numbers."""

from __future__ import annotations

from importlib import metadata

from hashdist.options import closest

# names other evaluation scripts and tools use, each with hashdist's option for it (offered when the command has it)
BORROWED = {
    "--k": ("--topk", "--top-k", "--topn", "--top-n", "--at", "--at-k", "--cutoff", "--cutoffs", "--cut-off",
            "--map-at", "-k"),
    "--radius": ("--radii", "--hamming-radius", "--radiuses", "--hamming-radii", "--ball"),
    "--distance": ("--metric", "--distance-metric", "--similarity"),
    "--nbits": ("--nbit", "--bits", "--n-bits", "--num-bits", "--code-length", "--code-len"),
    "--out": ("--output", "--output-dir", "--outdir", "--out-dir", "--save", "--save-dir", "--dest", "-o"),
    "--threads": ("--jobs", "--n-jobs", "--num-threads", "--nthreads", "-j"),
    "--workers": ("--num-workers", "--n-workers", "--nworkers"),
    "--overwrite": ("--force", "-f", "--replace"),
    "--quiet": ("--silent", "--no-progress", "-q"),
    "--debug": ("--verbose", "-v", "--traceback"),
    "--no-html": ("--no-plot", "--no-plots", "--no-report"),
    "--seed": ("--random-seed", "--random-state", "--rng"),
    "--query-block-rows": ("--batch-size", "--batch", "--chunk-size"),
    "--query-relevant": ("--gt", "--groundtruth", "--ground-truth", "--relevant"),
    "--db-codes": ("--database", "--db", "--database-codes", "--retrieval-codes", "--gallery"),
    "--query-codes": ("--queries", "--qcodes", "--query-set"),
}
_BORROWED_AS = {alias: option for option, aliases in BORROWED.items() for alias in aliases}
# names that stand for no option: what hashdist does instead
_ALWAYS = {"--metrics": "every metric is computed; no option picks them",
           "--all-metrics": "every metric is computed; no option picks them"}


def _normalised(word: str) -> str:
    """``--topK`` and ``--top_k`` as ``--topk`` and ``--top-k``; ``--out=DIR`` as ``--out``."""
    name = word.split("=")[0]
    return name if name.startswith("-") and not name.startswith("--") else name.lower().replace("_", "-")


def hint(word: str, known: list[str]) -> str | None:
    """What an unknown option ``word`` most likely meant among the command's ``known`` options, as a phrase: the
    option a borrowed name stands for, else the closest by spelling (long options only); None for no guess."""
    name = _normalised(word)
    if name in _ALWAYS:
        return _ALWAYS[name]
    option = _BORROWED_AS.get(name)
    if option not in known and name.startswith("--"):
        option = closest(name, [flag for flag in known if flag.startswith("--")])
    return f"did you mean {option}?" if option in known else None


VERSIONED = ("hashdist", "numpy", "numba", "zarr", "prefect", "dask", "distributed")


def hints(words: list[str], known: list[str], named: bool = False) -> str:
    """" (hint)" for the unknown options among ``words`` (a command line's), one per option that has one (each
    prefixed by its option when there are several, or ``named``); "" when there is none."""
    found = [(word.split("=")[0], phrase) for word in words if word.startswith("-") and word != "-"
             and word.split("=")[0] not in known for phrase in [hint(word, known)] if phrase]
    text = "; ".join(phrase if len(found) == 1 and not named else f"{word}: {phrase}" for word, phrase in found)
    return f" ({text})" if text else ""


def versions() -> str:
    """``hashdist --version``: hashdist's version, then those of the packages its numbers and runs depend on (read
    from the installed packages' metadata: nothing is imported)."""
    import platform

    def version(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    first, *rest = VERSIONED
    return f"hashdist {version(first)}\n" + "\n".join(f"  {name} {version(name)}" for name in rest) + \
        f"\n  python {platform.python_version()}"
