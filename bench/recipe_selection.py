"""Choose an ablation table's finetuning recipe on validation, then read its test scores.

Each candidate recipe is one `t5lite ablate` workdir run with the same rows and seeds and a
different finetuning setting. The criterion is fixed before any number is read: the mean over
the rows of each finetuning run's best validation score (the `eval_tasks` lines that `ablate`'s
checkpoint selection itself uses). Only the winner's test scores are meant for reporting; the
others are printed so the choice can be checked, and labelled as not chosen.

    python bench/recipe_selection.py --table table2 --metric topic_debian/accuracy \
        A=/work/study18/A B=/work/study18/B
"""
import argparse
import json
import statistics
from pathlib import Path


def best_validation(finetune_dir: Path, metric: str) -> float:
    scores = []
    for line in (finetune_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("split") == "eval_tasks" and metric in record:
            scores.append(record[metric])
    if not scores:
        raise SystemExit(f"{finetune_dir}: no eval_tasks line with {metric}; did it finish?")
    return max(scores)


def row_scores(workdir: Path, table: str, metric: str) -> dict:
    """row -> (best validation per finetuning run, test mean from result.json)."""
    task = metric.split("/")[0]
    rows = {}
    for result_file in sorted((workdir / table).glob("*/result.json")):
        result = json.loads(result_file.read_text())
        row_dir = result_file.parent
        runs = sorted(row_dir.glob(f"finetune_{task}")) + sorted(
            row_dir.glob(f"seed*/finetune_{task}"))
        valid = [best_validation(run, metric) for run in runs]
        rows[result["row"]] = (valid, result["metrics"][metric])
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", default="table2")
    parser.add_argument("--metric", default="topic_debian/accuracy")
    parser.add_argument("candidates", nargs="+", help="NAME=WORKDIR, one per recipe")
    args = parser.parse_args()
    scores = {}
    for item in args.candidates:
        name, _, workdir = item.partition("=")
        scores[name] = row_scores(Path(workdir), args.table, args.metric)
    rows = sorted(set.intersection(*(set(s) for s in scores.values())))
    if not rows:
        raise SystemExit("no row finished in every candidate workdir")
    criterion = {name: statistics.mean(statistics.mean(s[row][0]) for row in rows)
                 for name, s in scores.items()}
    winner = max(criterion, key=criterion.get)
    print(f"rows: {', '.join(rows)}; criterion: mean best validation {args.metric}")
    print("| recipe | " + " | ".join(f"{row} valid" for row in rows) + " | mean valid | "
          + " | ".join(f"{row} test" for row in rows) + " |")
    print("|---" * (2 * len(rows) + 2) + "|")
    for name, s in scores.items():
        valid = " | ".join(f"{statistics.mean(s[row][0]):.2f}" for row in rows)
        test = " | ".join(f"{s[row][1]:.2f}" if name == winner else f"({s[row][1]:.2f})"
                          for row in rows)
        mark = " (chosen)" if name == winner else ""
        print(f"| {name}{mark} | {valid} | {criterion[name]:.2f} | {test} |")
    print(f"chosen on validation: {winner}; test in parentheses belongs to recipes not chosen")


if __name__ == "__main__":
    main()
