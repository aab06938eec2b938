"""symfusion-align-many: move k >= 2 model folders into one shared basis and write k aligned folders (align_many()).

    symfusion-align-many MODEL_DIR MODEL_DIR [MODEL_DIR ...] --output DIR [--matching full_symmetry] [--max-rounds 10]

Each folder is read as symfusion-match reads a model (safetensors only, every tensor of its config present, shaped
and finite; the k of one family and shape). DIR receives, atomically, model_0 .. model_{k-1} (each a standard folder
in its source's layout and dtypes, with transform.safetensors) and many.json (the report); a previous output of this
command is replaced, anything else is refused. A plain average of the k folders' weights (mergekit's linear merge)
is then the centroid merge. A refusal is one `error: ...` line on stderr, exit code 2, nothing written.
"""
from __future__ import annotations

import argparse
import sys

from symfusion.errors import as_symfusion_error, erase_progress, said_on_success
from symfusion.many import align_many
from symfusion.matching.universe import MAX_ROUNDS

PROG = "symfusion-align-many"


class OneLineParser(argparse.ArgumentParser):
    """argparse with its usage errors as one `error:` line (exit 2), as every symfusion command's; --help shows the
    usage."""

    def error(self, message: str):
        self.exit(2, f"error: {message}; see {PROG} --help\n")


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="k >= 2 model folders (save_pretrained, safetensors)")
    parser.add_argument("--output", required=True, help="the folder to write (model_0 .. model_{k-1}, many.json)")
    parser.add_argument("--matching", default="full_symmetry", help="a data-free matching preset (full_symmetry)")
    parser.add_argument("--max-rounds", default=str(MAX_ROUNDS), help=f"rounds after the start (default {MAX_ROUNDS})")
    args = parser.parse_args(argv)
    try:
        rounds = int(args.max_rounds)
    except ValueError:
        rounds = None
    if rounds is None or rounds < 0:
        print(f"error: --max-rounds {args.max_rounds[:40]!r}: give an integer >= 0", file=sys.stderr)
        return 2
    try:
        with said_on_success(sys.stderr):
            folders, report = align_many(args.models, matching=args.matching, output=args.output, max_rounds=rounds)
    except Exception as error:      # noqa: BLE001 - bad input and the system's errors are one line; a bug is raised
        line = as_symfusion_error(error)
        if line is None:
            raise
        erase_progress()
        print(f"error: {line}", file=sys.stderr)
        return 2
    objective = report["objective"]
    print(f"wrote {len(folders)} aligned folders to {args.output} ({report['matching']}; J {objective[0]:.6g} -> "
          f"{objective[-1]:.6g} in {len(report['rounds'])} rounds, {report['stop']}; {report['seconds']:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
