"""The ``aot`` command line: parse, call the library, map errors to exit codes.

Exit codes (also in README.md): 0 success, 1 internal error, 2 bad recipe or
usage, 3 trace failure, 4 pass failure, 5 validation failure, 6 export
failure, 7 artifact integrity failure, 130 interrupted (SIGINT, Ctrl-C), 143
terminated (SIGTERM). Every failure is one line on stderr; ``--debug`` adds the
traceback and the logs of the libraries aot drives.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable
from typing import Any

import click

from aot.errors import EXIT_CODES, AotError


class Stopped(BaseException):
    """SIGINT or SIGTERM arrived. A BaseException, like KeyboardInterrupt, so every ``except BaseException``
    cleanup runs (staging removed, the export child killed) and no ``except Exception`` swallows it."""

    def __init__(self, signal_number: int):
        super().__init__(signal.Signals(signal_number).name)
        self.exit_code = 128 + signal_number
        self.message = "interrupted" if signal_number == signal.SIGINT else f"terminated by {self.args[0]}"


_pending_stop: list[int] = []


def _stop(signal_number: int, frame: Any) -> None:
    # Remembered as well as raised: an exception raised where Python swallows it (a __del__, a
    # weakref callback) would be lost, and the next stage boundary raises it again (_StderrProgress).
    _pending_stop.append(signal_number)
    raise Stopped(signal_number)


def _raise_pending_stop() -> None:
    if _pending_stop:
        raise Stopped(_pending_stop[0])


def _send_lost_stop_again(unraisable: Any) -> None:
    """``sys.unraisablehook``: a Stopped raised where Python cannot propagate it is sent again, not printed.

    Python prints such an exception ("Exception ignored in ...") and goes on; the signal is
    delivered again from a thread, so the handler next runs in ordinary code and stops the build.
    """
    if isinstance(unraisable.exc_value, Stopped):
        import threading

        number = unraisable.exc_value.exit_code - 128
        threading.Timer(0.01, os.kill, (os.getpid(), number)).start()
        return
    sys.__unraisablehook__(unraisable)


def _echo_error(message: str) -> None:
    click.echo(f"aot: error: {message}", err=True)


def _run(debug: bool, action: Callable[[], Any]) -> Any:
    try:
        return action()
    except AotError as error:
        if debug:
            traceback.print_exc()
        _echo_error(str(error))
        sys.exit(error.exit_code)
    except KeyboardInterrupt:
        _echo_error("interrupted")
        sys.exit(130)
    except OSError as error:  # a file aot had to read or write, named by the OS error itself
        if debug:
            traceback.print_exc()
        _echo_error(f"{error.filename or 'I/O'}: {error.strerror or error}" if error.filename else f"I/O error: {error}")
        sys.exit(2)
    except Exception as error:  # an aot bug: one line by default, the traceback with --debug
        if debug:
            traceback.print_exc()
        _echo_error(f"internal error: {type(error).__name__}: {error} (run with --debug for the traceback)")
        sys.exit(1)


class _StderrProgress:
    """Stages as they run, on stderr when it is a terminal: a spinner with the elapsed time, and a line
    per finished stage that took a second or more. Piped or redirected, stderr stays for the error line
    (``--verbose`` logs each stage there)."""

    def __init__(self) -> None:
        self._progress = None
        self._tasks: dict[str, Any] = {}
        if sys.stderr.isatty():
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                      console=_stderr_console(), transient=True)

    def __call__(self, stage: str, event: str, seconds: float | None) -> None:
        _raise_pending_stop()
        if self._progress is None:
            return
        if event == "start":
            self._progress.start()
            self._tasks[stage] = self._progress.add_task(stage, total=None)
            return
        task = self._tasks.pop(stage, None)
        if task is not None:
            self._progress.remove_task(task)
        if seconds is not None and seconds >= 1.0:
            self._progress.console.print(f"  {stage:<24} {seconds:6.1f}s", highlight=False)

    def tick(self, label: str) -> None:
        """A bench round: shown on the running stage's line."""
        if self._progress is not None and self._tasks:
            self._progress.update(next(reversed(self._tasks.values())), description=f"bench {label}")

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


def _with_progress(debug: bool, action: Callable[[_StderrProgress], Any]) -> Any:
    progress = _StderrProgress()
    try:
        return _run(debug, lambda: action(progress))
    finally:
        progress.close()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.option("-v", "--verbose", is_flag=True, help="Log what each stage does (stderr).")
@click.version_option(package_name="aot")
@click.pass_context
def main(context: click.Context, debug: bool, verbose: bool) -> None:
    """aot: ahead-of-time build tool for PyTorch and Hugging Face models."""
    context.obj = {"debug": debug}
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    if verbose and not debug:  # aot's own stages; the libraries' INFO records (onnxscript's optimizer...) are --debug's
        logging.getLogger("aot").setLevel(logging.INFO)


_SET = click.option(
    "--set", "overrides", multiple=True, metavar="KEY=VALUE",
    help="Override a recipe key (repeatable; a later one wins): a dotted key, created where absent, and a YAML value "
    "(2, true, bfloat16, [a, b]), e.g. --set model.config.num_hidden_layers=2. The file is not changed.",
)


@main.command()
@click.argument("recipe", type=click.Path(dir_okay=False, path_type=str))
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=str),
              help="Output directory: new, empty, or an earlier aot build (nothing else is ever replaced).")
@_SET
@click.option("--cache", "cache", metavar="URL",
              help="Build cache: a directory or an fsspec URL (memory://, s3://bucket/path with the s3 extra). A build of "
              "the same key is restored from it, proved against its manifest, instead of built; a new build is stored.")
@click.option("--cache-option", "cache_options", multiple=True, metavar="KEY=VALUE",
              help="An fsspec option for --cache's filesystem (repeatable; the value is YAML), e.g. "
              "--cache-option endpoint_url=http://127.0.0.1:9000 for s3://. AWS_ENDPOINT_URL and AWS_PROFILE apply too.")
@click.option("--json", "as_json", is_flag=True, help="Print the build report as JSON on stdout.")
@click.pass_context
def build(context: click.Context, recipe: str, output: str | None, overrides: tuple[str, ...], cache: str | None,
          cache_options: tuple[str, ...], as_json: bool) -> None:
    """Build RECIPE: trace, run passes, validate, write artifacts and manifest.

    \b
    Overrides: --set KEY=VALUE changes one recipe key for this build, without
    editing the file, e.g. a shipped recipe at tiny size:
      aot build recipes/bert.yaml --set model.config.num_hidden_layers=2
    The key is dotted (missing mappings are created) and the value is YAML
    (2, true, bfloat16, [a, b]); the result is checked as the file would be,
    and errors name the key as "--set KEY". The manifest records the recipe
    with the overrides applied (recipe.resolved) and the overrides as given
    (recipe.overrides); the build's recipe.yaml is the file, unchanged.
    """

    if cache_options and cache is None:
        raise click.BadParameter("needs --cache URL", param_hint="--cache-option")

    def run(progress: _StderrProgress) -> Any:
        from aot.recipe.load import load_recipe

        # Its schema is checked before torch is imported: a typo is reported at once.
        loaded = load_recipe(recipe, overrides=overrides)
        if cache is not None:
            from aot.builder.cached import build_with_cache
            from aot.cache.store import storage_options

            return build_with_cache(loaded, output, progress=progress, cache=cache, cache_options=storage_options(cache_options))
        from aot.builder.spine import build as run_build

        return run_build(loaded, output, progress=progress)

    result = _with_progress(context.obj["debug"], run)
    report = result.report if cache is not None else result  # None: a cache hit, nothing was built
    if as_json:
        click.echo(json.dumps(result.report_json if cache is not None else report.to_json(), indent=2))
    elif report is not None:
        worst = max((c.to_json()["max_abs"] for c in report.validation), default=0.0)
        shapes = len({c.shape for c in report.validation})
        changed = sum(1 for p in report.passes if p.modified)
        click.echo(
            f"built {report.name} -> {report.output} in {report.stages.get('total', 0):.1f}s "
            f"({_plural(len(report.passes), 'pass')} run, {changed} changed the graph; "
            f"validated {_plural(len(report.validation), 'run')} at {_plural(shapes, 'shape')}, max abs error {worst:.2g}"
            f"{_gate_summary(report.accuracy)}); "
            f"manifest sha256 {report.manifest_sha256}"
        )
    if cache is not None and not as_json and _cache_line(result):
        click.echo(_cache_line(result))


def _cache_line(result: Any) -> str | None:
    """What the build cache did, in one line; None when it could not be used (a warning on stderr said why)."""
    outcome = result.cache
    if outcome.hit:
        return (f"cache hit {outcome.key[:12]}…: restored {outcome.files} files to {result.output}; "
                f"manifest sha256 {result.manifest_sha256}")
    if not outcome.available:
        return None
    return f"cache miss {outcome.key[:12]}…; " + (f"stored {outcome.files} files in {outcome.url}" if outcome.stored else "not stored")


_CACHE_OPTION = click.option("--cache-option", "cache_options", multiple=True, metavar="KEY=VALUE",
                             help="An fsspec option for URL's filesystem, as aot build --cache-option takes it.")


@main.group(name="cache")
def cache_group() -> None:
    """The build cache (aot build --cache URL): list its entries, prune them. URL: a directory or an fsspec URL."""


def _with_cache_store(debug: bool, url: str, cache_options: tuple[str, ...], action: Callable[[Any], Any]) -> Any:
    """``action(store)``; a store that cannot be opened or read is exit 2, one line naming URL."""

    def run() -> Any:
        from aot.cache.errors import CacheUnavailable
        from aot.cache.store import CacheStore, storage_options
        from aot.errors import RecipeError

        try:
            return action(CacheStore.open(url, storage_options(cache_options), create=False))
        except CacheUnavailable as error:
            raise RecipeError(str(error)) from None

    return _run(debug, run)


@cache_group.command(name="ls")
@click.argument("url")
@_CACHE_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the entries as JSON on stdout.")
@click.pass_context
def cache_ls(context: click.Context, url: str, cache_options: tuple[str, ...], as_json: bool) -> None:
    """List the entries of the build cache at URL, newest first: key, date, size, files, recipe name."""
    from aot.cache.listing import list_entries

    listed = _with_cache_store(context.obj["debug"], url, cache_options, list_entries)
    if as_json:
        click.echo(json.dumps([item.to_json() for item in listed], indent=2))
        return
    for item in listed:
        described = f"{_plural(len(item.entry.files), 'file')}  {item.name}" if item.entry else f"unreadable: {item.problem}"
        click.echo(f"{item.key[:16]}  {item.created:%Y-%m-%d %H:%M}  {item.bytes / 2**20:9.1f} MiB  {described}")
    if not listed:
        click.echo(f"no entries in {url}")


@cache_group.command(name="prune")
@click.argument("url")
@click.option("--older-than", type=click.FloatRange(min=0), metavar="DAYS", help="Remove the entries older than DAYS.")
@click.option("--keep", type=click.IntRange(min=0), metavar="N", help="Keep only the N newest entries.")
@click.option("--blob-grace", type=click.FloatRange(min=0), default=60, show_default=True, metavar="MINUTES",
              help="Keep a blob no entry names while it is younger than this: a build may be storing it now.")
@_CACHE_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print what was removed as JSON on stdout.")
@click.pass_context
def cache_prune(context: click.Context, url: str, older_than: float | None, keep: int | None, blob_grace: float,
                cache_options: tuple[str, ...], as_json: bool) -> None:
    """Remove entries of the build cache at URL (unreadable ones always), then the blobs no remaining entry names."""
    from datetime import timedelta

    from aot.cache.prune import prune

    report = _with_cache_store(context.obj["debug"], url, cache_options, lambda store: prune(
        store, None if older_than is None else timedelta(days=older_than), keep, timedelta(minutes=blob_grace)))
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        removed = len(report.entries_removed)
        click.echo(f"removed {removed} {'entry' if removed == 1 else 'entries'} ({report.entries_kept} kept) and "
                   f"{_plural(report.blobs_removed, 'blob')} ({report.blobs_kept} kept) from {url}")


@main.command()
@click.argument("recipe", type=click.Path(dir_okay=False, path_type=str))
@_SET
@click.option("--json", "as_json", is_flag=True, help="Print what was checked as JSON on stdout.")
@click.pass_context
def check(context: click.Context, recipe: str, overrides: tuple[str, ...], as_json: bool) -> None:
    """Check RECIPE without building: schema, passes, ranges, files, input names (--set as aot build takes it)."""
    from aot.builder.check import check_recipe

    report = _run(context.obj["debug"], lambda: check_recipe(recipe, overrides=overrides))
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        click.echo(f"ok: {report.summary()}")


def _sha256_option(context: click.Context, parameter: click.Parameter, value: str | None) -> str | None:
    """A malformed digest is a usage error before anything loads (exit 2)."""
    from aot.directory.integrity import expected_sha256
    from aot.errors import RecipeError

    try:
        return expected_sha256(value)
    except RecipeError as error:
        raise click.BadParameter(str(error), context, parameter) from None


_EXPECT_SHA256 = click.option(
    "--expect-sha256", metavar="HEX", callback=_sha256_option,
    help="The sha256 of manifest.json as its builder published it (aot build prints it): "
    "proves every file of a directory from elsewhere before anything in it runs.",
)


_TRUST_CODE = click.option(
    "--trust-code", is_flag=True,
    help="Run module.py (and recipe.yaml's factory) from a directory this machine did not build, without its digest.",
)


_PUBLIC_KEY = click.option(
    "--public-key", type=click.Path(dir_okay=False, path_type=str), metavar="PUB.pem",
    help="Run the directory only if its OpenSSF model signature (aot sign) verifies with this key over every file; "
    "the manifest's sha256 it signs then serves as --expect-sha256 (and as consent to run its code).",
)


_SIGNATURE = click.option(
    "--signature", type=click.Path(dir_okay=False, path_type=str), metavar="SIG",
    help="The signature --public-key checks (default: DIR.sig beside DIR, else DIR/model.sig).",
)


def _require_public_key(public_key: str | None, signature: str | None) -> None:
    if signature is not None and public_key is None:
        from aot.errors import RecipeError

        raise RecipeError("--signature needs --public-key: the key to check it with")


def _signed_expectation(directory: str, public_key: str | None, signature: str | None, expect_sha256: str | None) -> str | None:
    """--public-key: the manifest sha256 the directory's verified signature signs, to stand for --expect-sha256."""
    _require_public_key(public_key, signature)
    if public_key is None:
        return expect_sha256
    from aot.directory.signed import signed_manifest_sha256

    return signed_manifest_sha256(directory, public_key, signature, expect_sha256)


@main.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=str))
@click.option("--recipe", type=click.Path(dir_okay=False, path_type=str), help="Recipe to rebuild the eager model from.")
@_EXPECT_SHA256
@_TRUST_CODE
@_PUBLIC_KEY
@_SIGNATURE
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@click.pass_context
def validate(context: click.Context, directory: str, recipe: str | None, expect_sha256: str | None, trust_code: bool,
             public_key: str | None, signature: str | None, as_json: bool) -> None:
    """Re-check a build directory: every file against the manifest first, then numerics against the eager model."""

    def run(progress: _StderrProgress) -> Any:
        from aot.validate.directory import validate_directory

        expected = _signed_expectation(directory, public_key, signature, expect_sha256)
        return validate_directory(directory, recipe, expected, progress=progress, trust_code=trust_code)

    report = _with_progress(context.obj["debug"], run)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        click.echo(
            f"ok: {report.files_checked} files match the manifest (sha256 {report.manifest_sha256}); "
            f"{len(report.validation)} runs within tolerance{_gate_summary(report.accuracy)}"
        )


def _parse_grid(values: tuple[str, ...]) -> dict[str, list[int]]:
    """``-s DIM=SIZE[,SIZE...]``, each dim once: the grid is the product of the dims' sizes."""
    grid: dict[str, list[int]] = {}
    for value in values:
        name, _, sizes = (part.strip() for part in value.partition("="))
        try:
            if not name:
                raise ValueError(value)
            parsed = [int(size) for size in sizes.split(",")]
        except ValueError:
            raise click.BadParameter(f"'{value}' is not DIM=SIZE[,SIZE...]", param_hint="--shape") from None
        if name in grid:
            first = ",".join(map(str, grid[name]))
            raise click.BadParameter(f"dim '{name}' given twice ({name}={first} and {name}={sizes}): give each dim once, with "
                                     f"all its sizes (-s {name}={first},{sizes})", param_hint="--shape")
        grid[name] = parsed
    return grid


def _peers_help() -> str:
    from aot.bench.peer_groups import peers_help  # names only: no torch for the command line's help

    return peers_help()


@main.command(name="bench")
@click.argument("target", type=click.Path(exists=True, path_type=str))
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=str), help="Where to build when TARGET is a recipe (a build directory refuses it).")
@click.option("-s", "--shape", "shapes", multiple=True,
              help="Grid dim, e.g. -s batch=1,8 -s sequence=128: each dim once, with all its sizes; the grid is their product. "
              "Sizes must lie within what the build was checked for (its dims' ranges; a decoder's prompt and new tokens within its positions).")
@click.option("--runs", type=click.IntRange(min=1), default=30, show_default=True, help="Timed rounds per shape.")
@click.option("--warmup", type=click.IntRange(min=0), default=3, show_default=True, help="Untimed calls per runner first.")
@click.option("--threads", type=click.IntRange(min=1), help="Intra-op threads for torch and ONNX Runtime (default: torch's).")
@click.option("--no-memory", is_flag=True, help="Skip the peak-memory probe.")
@click.option("--chart", type=click.Path(dir_okay=False, path_type=str),
              help="Also draw the paired speedups as a chart, in the format its extension names (NAME.png without one), after the "
              "results are printed; needs matplotlib: pip install 'aot[chart]'.")
@click.option("--peers", default="", help=_peers_help())
@click.option("--gap-ms", type=click.FloatRange(min=0), default=50.0, show_default=True, help="Idle time before each timed call, so the previous runner's threads settle.")
@click.option("--in-process", is_flag=True, help="Keep every runner in this one process (distorted figures, no memory; labelled so).")
@click.option("--new-tokens", type=click.IntRange(min=1), help="A decoder build only: tokens each timed generation makes (default: 32; its dims: -s batch=1,2 -s prompt=32,128).")
@click.option("--recipe", type=click.Path(dir_okay=False, path_type=str),
              help="Recipe to rebuild the eager model from (default: the one the manifest names while it is still the recipe built, else the build's copy).")
@_EXPECT_SHA256
@_TRUST_CODE
@_PUBLIC_KEY
@_SIGNATURE
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@click.pass_context
def bench_command(context, target, output, shapes, runs, warmup, threads, no_memory, chart, peers, gap_ms, in_process, new_tokens,
                  recipe, expect_sha256, trust_code, public_key, signature, as_json) -> None:
    """Time eager and every artifact the build wrote (the saved GraphModule, ONNX Runtime, a compiled package), each in its own process, on TARGET (a build directory or a recipe)."""
    from pathlib import Path

    from aot.bench.peer_groups import peer_items

    grid = _parse_grid(shapes)
    try:
        wanted = peer_items(peers)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--peers") from error

    def run(progress: _StderrProgress) -> Any:
        from aot.bench import bench
        from aot.errors import RecipeError

        is_recipe = Path(target).is_file()
        if output is not None and not is_recipe:
            raise RecipeError(f"-o {output}: it says where to build a recipe, and {target} is a build directory already")
        if chart:
            from aot.bench.chart import check_chart_path

            check_chart_path(Path(chart))
        directory = target
        if is_recipe:
            if public_key is not None:
                raise RecipeError(f"--public-key checks a build directory's signature; {target} is a recipe")
            from aot.bench.request import check_request
            from aot.builder.spine import build as run_build
            from aot.recipe.load import load_recipe
            from aot.recipe.plan import plan_build

            check_request(plan_build(load_recipe(target)), grid, wanted, new_tokens)  # before the build, as well as after
            directory = run_build(target, output, progress=progress).output
        expected = _signed_expectation(directory, public_key, signature, expect_sha256)
        return bench(directory, grid, runs=runs, warmup=warmup, threads=threads, memory=not no_memory, peers=wanted,
                     tick=progress.tick, progress=progress, expect_sha256=expected,
                     mode="in-process" if in_process else "processes", gap_ms=gap_ms, new_tokens=new_tokens,
                     trust_code=trust_code, recipe=recipe)

    report = _with_progress(context.obj["debug"], run)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        _print_bench(report)
    if chart:  # after the results: a chart that fails now loses none of them
        from aot.bench.chart import draw_chart

        _run(context.obj["debug"], lambda: draw_chart(report, Path(chart)))


def _stderr_console():
    from rich.console import Console

    return Console(stderr=True)


def _shape_label(shape) -> str:
    """``batch=1,sequence=128``; a decoder's generations add what was timed: ``prefill`` or ``decode`` (ms per token)."""
    label = ",".join(f"{k}={v}" for k, v in shape.shape.items())
    return label if shape.measure == "call" else f"{label} {shape.measure}{' /token' if shape.measure == 'decode' else ''}"


_BENCH_NOTES = (
    "vs eager: eager's median / the runner's median",
    "paired: median over rounds of eager's time / the runner's time in the same round (the figure to quote)",
    "peak MiB: the runner's process at its peak over the warm-up at this shape, less its size before it loaded the "
    "runner: what the runner added, not a size ('-': not measured)",
)


def _print_bench(report) -> None:
    from rich.console import Console
    from rich.table import Table

    from aot.bench.driver import counted

    where = "each runner in its own process" if report.mode == "processes" else "ALL RUNNERS IN ONE PROCESS (distorted)"
    machine = report.cpu if report.device == "cpu" else f"{report.device} (CUDA events; host {report.cpu})"
    table = Table(title=f"{report.build}: {machine}, {counted(report.threads, 'thread')}, {counted(report.runs, 'round')}, {where}")
    labels = [_shape_label(shape) for shape in report.shapes]
    runners = [figures.runner for shape in report.shapes for figures in shape.runners]
    widths = {"shape": max(map(len, labels), default=5), "runner": max(map(len, runners), default=6)}
    columns = ("shape", "runner", "median ms", "p10 ms", "p90 ms", "vs eager", "paired", "paired p10-p90", "1st call ms", "peak MiB")
    for column in columns:
        # Names are never cut: two peers share a prefix ("ort_torchscript", "ort_torchscript_fused").
        table.add_column(column, justify="left" if column in widths else "right", no_wrap=True, min_width=widths.get(column))
    shown = []  # shapes whose warm-up figures are on a row already: a decoder's decode row repeats its prefill's
    for shape in report.shapes:
        label, once = _shape_label(shape), shape.shape not in shown
        shown.append(shape.shape)
        for figures in shape.runners:
            warm = (f"{figures.first_call_ms:.0f}", "-" if figures.peak_mib is None else f"{figures.peak_mib:.0f}") if once else ("", "")
            table.add_row(label, figures.runner, f"{figures.median_ms:.2f}", f"{figures.p10_ms:.2f}", f"{figures.p90_ms:.2f}",
                          f"{figures.speedup:.2f}x", f"{figures.paired_speedup:.2f}x",
                          f"{figures.paired_p10:.2f}-{figures.paired_p90:.2f}", *warm)
            label = ""
    console = Console(width=None if sys.stdout.isatty() else 200)  # a pipe or a file gets whole rows
    console.print(table)
    for note in _BENCH_NOTES:
        console.print(note)
    if any(shape.measure != "call" for shape in report.shapes):
        console.print("1st call ms, peak MiB: once per shape, on its prefill rows; a decoder's 1st call is its first "
                      "generation's prefill ms + mean decode ms per token")
    console.print("setup: " + ", ".join(f"{name} {seconds:.1f}s" for name, seconds in report.setup_s.items()))
    for artifact, metrics in report.accuracy.items():
        console.print(f"accuracy on the gate data, {artifact}: " + ", ".join(f"{name} {value:.6f}" for name, value in metrics.items()))
    for peer, reason in report.peer_failures.items():
        console.print(f"peer {peer} could not be built: {reason}")
    for peer, reason in report.peers_skipped.items():
        console.print(f"peer {peer} skipped: {reason}")
    if report.build_stages_s:
        console.print("build stages: " + ", ".join(f"{k} {v:.1f}s" for k, v in report.build_stages_s.items()))


@main.command(name="run")
@click.argument("directory", type=click.Path(file_okay=False, path_type=str))
@click.argument("texts", nargs=-1)
@click.option("--runtime", default="onnx", show_default=True,
              help="Which artifact answers: onnx (ONNX Runtime), torch (graph_module/module.py), or any other kind the build "
              "wrote (aot.export.kinds; an unknown name lists them). Artifacts that run code need --trust-code.")
@click.option("--file", "file", type=click.Path(dir_okay=False, path_type=str),
              help="Texts from a file: one a line, or JSONL (.jsonl) with --field. Without TEXT or --file: stdin.")
@click.option("--field", help="The JSONL field that holds the text (default for .jsonl: text).")
@click.option("--ids", multiple=True, help="Token ids instead of text, e.g. --ids '101 7592 102' (repeat for more): "
              "for an encoder or a classifier, and the way into a build that ships no tokenizer.")
@click.option("--pooling", type=click.Choice(["mean", "cls", "none"]), help="An encoder's pooling (default: the recipe's, else mean).")
@click.option("--similarity", is_flag=True, help="An encoder: the cosine similarity of every pair of texts.")
@click.option("--top", type=click.IntRange(min=1), help="A classifier: labels shown per text (default: 3).")
@click.option("--max-new-tokens", type=click.IntRange(min=1), help="A decoder: tokens generated per prompt (greedy; stops at eos; default: 32).")
@click.option("--threads", type=click.IntRange(min=1), help="Intra-op threads: ONNX Runtime's, or torch's with --runtime torch (default: their own).")
@_EXPECT_SHA256
@_TRUST_CODE
@_PUBLIC_KEY
@_SIGNATURE
@click.option("--json", "as_json", is_flag=True, help="Print the answers as JSON on stdout.")
@click.pass_context
def run_command(context, directory, texts, runtime, file, field, ids, pooling, similarity, top, max_new_tokens, threads,
                expect_sha256, trust_code, public_key, signature, as_json) -> None:
    """Run a build directory's artifact on real input: an encoder's embeddings or similarities, a classifier's
    labels, a decoder's generated text, a vision classifier's labels for image files (TEXT is a path). Files are
    checked against the manifest first."""

    def run(progress: _StderrProgress) -> Any:
        from aot.run import load
        from aot.run.answers import answer, parse_ids, texts_from

        inputs = texts_from(texts, file, field, sys.stdin, ids)
        token_ids = parse_ids(ids) if ids else None
        _require_public_key(public_key, signature)
        model = load(directory, runtime, expect_sha256=expect_sha256, trust_code=trust_code, threads=threads,
                     public_key=public_key, signature=signature)
        with _BatchBar(len(token_ids or inputs)) as bar:
            return answer(model, inputs, similarity=similarity, pooling=pooling, top=top, max_new_tokens=max_new_tokens,
                          on_batch=bar.update, token_ids=token_ids)

    result = _with_progress(context.obj["debug"], run)
    click.echo(json.dumps(result, indent=2) if as_json else _answers_text(result))


class _BatchBar:
    """A progress bar on stderr (a terminal only) while many texts run."""

    def __init__(self, total: int) -> None:
        self._progress = None
        if total > 32 and sys.stderr.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

            self._progress = Progress(BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=_stderr_console(), transient=True)
            self._task = self._progress.add_task("texts", total=total)

    def __enter__(self) -> _BatchBar:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def update(self, done: int, total: int) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=done)


def _example(item: dict[str, Any]) -> str:
    """What an answer is about: its text, its image file, or its token ids."""
    return item.get("text") or item.get("image") or " ".join(map(str, item["ids"]))


def _answers_text(result: dict[str, Any]) -> str:
    """The answers for people: one line a text (a similarity matrix for --similarity)."""
    items = result["items"]
    if "similarity" in result:
        matrix = result["similarity"]
        if len(matrix) == 2:
            return f"similarity: {matrix[0][1]:.4f}"
        header = "      " + "".join(f"{j + 1:>8}" for j in range(len(matrix)))
        return "\n".join([header] + [f"{i + 1:>6}" + "".join(f"{value:8.4f}" for value in row) for i, row in enumerate(matrix)])
    if result["task"] == "decoder":  # each continuation carries its own leading space, or none (aot.run.built_model)
        return "\n".join(item["prompt"] + item["generated"] for item in items)
    if result["task"] in ("classifier", "vision"):
        return "\n".join(f"{_example(item)}: " + ", ".join(f"{l['label']} {l['score']:.3f}" for l in item["labels"]) for item in items)
    lines = []
    for item in items:
        vector = item["embedding"]
        head = ", ".join(f"{value:.4f}" for value in vector[:4])
        lines.append(f"{_example(item)}: [{head}, ...] ({len(vector)} dims, {result['pooling']} pooling)")
    return "\n".join(lines)


@main.command(name="sign")
@click.argument("directory", type=click.Path(file_okay=False, path_type=str))
@click.option("--key", required=True, type=click.Path(dir_okay=False, path_type=str), metavar="PRIVATE.pem",
              help="The private key (PEM, elliptic-curve: P-256, P-384 or P-521), e.g. from the job's secret store.")
@click.option("--password", envvar="AOT_SIGNING_KEY_PASSWORD", show_envvar=True,
              help="The encrypted key's password; better through the variable, which no process listing shows.")
@click.option("--signature", type=click.Path(dir_okay=False, path_type=str), metavar="SIG",
              help="Where the signature goes (default: DIR.sig beside DIR; inside DIR only as DIR/model.sig).")
@click.option("--certificate", type=click.Path(dir_okay=False, path_type=str), metavar="LEAF.pem",
              help="Sign as this certificate's subject: the certificate (PEM) of --key, carried in the signature with --chain.")
@click.option("--chain", multiple=True, type=click.Path(dir_okay=False, path_type=str), metavar="CHAIN.pem",
              help="The certificates from --certificate up to the root, PEM (repeatable; with --certificate, at least one: "
              "the root itself where it issued the certificate).")
@click.option("--provenance", type=click.Path(dir_okay=False, path_type=str), metavar="PROV",
              help="Also write SLSA v1 provenance there: a DSSE envelope signed with --key (inside DIR only as "
              "DIR/provenance.intoto.jsonl).")
@click.option("--json", "as_json", is_flag=True, help="Print what was signed as JSON on stdout.")
@click.pass_context
def sign_command(context, directory, key, password, signature, certificate, chain, provenance, as_json) -> None:
    """Sign a build directory: an OpenSSF model signature over every file, offline (model-signing), after checking
    the files against the manifest; --provenance adds SLSA provenance. Exit 2: a bad key or path; 7: the directory
    no longer matches its manifest. Nothing is written unless everything is (docs/release.md)."""

    def run() -> Any:
        from aot.errors import RecipeError

        if chain and certificate is None:
            raise RecipeError("--chain needs --certificate: the chain certifies the signing certificate")
        from aot.directory.signed import sign_build

        return sign_build(directory, key, signature=signature, password=password, certificate=certificate,
                          chain=chain, provenance=provenance)

    report = _run(context.obj["debug"], run)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
        return
    click.echo(f"signed {report.files_signed} files of {report.directory} -> {report.signature} ({report.signer}; "
               f"manifest sha256 {report.manifest_sha256}, model digest {report.model_digest})")
    if report.provenance is not None:
        click.echo(f"provenance -> {report.provenance}")


@main.command(name="verify")
@click.argument("directory", type=click.Path(file_okay=False, path_type=str))
@click.option("--public-key", type=click.Path(dir_okay=False, path_type=str), metavar="PUB.pem",
              help="The public key the signature must verify with (PEM).")
@click.option("--certificate-chain", multiple=True, type=click.Path(dir_okay=False, path_type=str), metavar="ROOT.pem",
              help="Instead of --public-key: the root (and intermediate) certificates the signing certificate must chain to (repeatable).")
@click.option("--signature", type=click.Path(dir_okay=False, path_type=str), metavar="SIG",
              help="The signature (default: DIR.sig beside DIR, else DIR/model.sig).")
@click.option("--provenance", type=click.Path(dir_okay=False, path_type=str), metavar="PROV",
              help="Also check this provenance: its envelope's signature, and that it names this manifest's sha256.")
@_EXPECT_SHA256
@click.option("--json", "as_json", is_flag=True, help="Print what was verified as JSON on stdout.")
@click.pass_context
def verify_command(context, directory, public_key, certificate_chain, signature, provenance, expect_sha256, as_json) -> None:
    """Verify a build directory: its signature over every file (model-signing's verifier), every file against the
    manifest it signs, and --provenance. Exit 0, or 7 naming the file or key at fault (2: bad usage or key)."""

    def run() -> Any:
        from aot.directory.signed import verify_build

        return verify_build(directory, signature=signature, public_key=public_key, certificate_chain=certificate_chain,
                            provenance=provenance, expect_sha256=expect_sha256)

    report = _run(context.obj["debug"], run)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
        return
    click.echo(f"ok: {report.signature} verifies ({report.signer}) over {report.files_signed} files; "
               f"{report.files_checked} files match {report.directory}/manifest.json (sha256 {report.manifest_sha256})")
    if report.provenance is not None:
        summary = report.provenance_summary
        click.echo(f"ok: {report.provenance} names that manifest; built by {summary.builder} ({summary.build_type}), "
                   f"{summary.dependencies} dependencies ({summary.packages} PyPI packages), "
                   f"{summary.started_on} to {summary.finished_on}")


@main.command(name="passes")
@click.option("--json", "as_json", is_flag=True, help="Print the registry as JSON.")
def list_passes(as_json: bool) -> None:
    """List the registered passes with their options and documentation."""
    from aot.passes import registry

    infos = sorted(registry.all_passes(), key=lambda info: info.name)
    if as_json:
        click.echo(json.dumps([_pass_json(info) for info in infos], indent=2))
        return
    for info in infos:
        click.echo(f"{info.name}  [{', '.join(sorted(info.frontends))}]")
        options = info.option_docs
        if options:
            click.echo("    options (recipe keys under the pass's name):")
            for option in options:
                click.echo(f"      {option.name}: {option.type} = {option.default}  # {option.description}")
        defaults = ", ".join(f"{option.name}: {option.default}" for option in options)
        click.echo("    in a recipe:")
        click.echo(f"      passes:\n        - {info.name}" + (f": {{{defaults}}}" if defaults else ""))
        click.echo("\n".join("    " + line if line else "" for line in (info.doc or "").strip().splitlines()))
        click.echo("")
    from aot.export.onnx_lowering import ONNX_LOWERING

    click.echo("The onnx artifact's own lowering, in the order it runs (not recipe keys; the manifest's onnx_lowering "
               "records what each changed):")
    for lowering in ONNX_LOWERING.values():
        click.echo(f"  {lowering.name}  [{lowering.form}]  {lowering.summary}")


@main.command()
def schema() -> None:
    """Print the recipe JSON Schema (for editor completion)."""
    from aot.recipe.load import recipe_json_schema_text

    click.echo(recipe_json_schema_text(), nl=False)


@main.command(name="exit-codes")
def exit_codes() -> None:
    """List the exit codes aot uses."""
    for code, meaning in sorted(EXIT_CODES.items()):
        click.echo(f"{code:>4}  {meaning}")


def _gate_summary(accuracy: list) -> str:
    if not accuracy:
        return ""
    lowest = {name: min(a.metrics[name] for a in accuracy) for name in accuracy[0].thresholds}
    return "; accuracy gate met by every artifact (" + ", ".join(f"lowest {k} {v:.4f}" for k, v in lowest.items()) + ")"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "es" if noun.endswith("s") else "s")


def _pass_json(info: Any) -> dict[str, Any]:
    return {
        "name": info.name,
        "class": info.cls.__name__,
        "frontends": sorted(info.frontends),
        "reversible": info.reversible,
        "preserves_computation": info.preserves_computation,  # false: a recipe needs a gate beside it
        "summary": info.summary,
        "doc": info.doc,
        "options": info.options.model_json_schema(),
    }


def entry_point() -> None:
    """The ``aot`` executable: :func:`main`, then exit without tearing the interpreter down.

    Signals and click's own outcomes are mapped here, so that each is one line on stderr with its
    documented code: a usage error (exit 2), Ctrl-C or SIGINT (130), SIGTERM (143), also while the
    libraries are still being imported.

    Freeing torch, transformers and ONNX Runtime object by object at exit took 1-1.5 s
    after a build here, time in which nothing is left to do: every artifact is written
    and renamed into place before the command returns. Output streams are flushed first.
    """
    for signal_number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signal_number, _stop)
    sys.unraisablehook = _send_lost_stop_again
    try:
        returned = main.main(standalone_mode=False, prog_name="aot")
        code = returned if isinstance(returned, int) else 0  # --help and --version return theirs
    except Stopped as stop:
        _echo_error(stop.message)
        code = stop.exit_code
    except click.exceptions.Abort:  # click's word for an interrupt it caught itself
        _echo_error("interrupted")
        code = 130
    except click.ClickException as error:  # usage: a bad option, a path that is a file, ...
        _echo_error(" ".join(error.format_message().split()))
        code = error.exit_code
    except SystemExit as exit_request:
        code = exit_request.code
        if code is None:
            code = 0
        elif not isinstance(code, int):
            click.echo(str(code), err=True)
            code = 1
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    entry_point()
