"""lm-evaluation-harness's own multiple-choice scores on the bundled dense stories260K, item by
item: what `quantppl eval --task` must reproduce (issue 55). Two task shapes from local files:
`stories_choice` (one context, several continuations: the shape of ARC, HellaSwag and MMLU;
acc and acc_norm) and `stories_winogrande` (one continuation after several contexts:
WinoGrande's partial scoring, through lm-eval's own winogrande preprocessing). lm-eval's `hf`
model in float32 on the CPU, batch 1; every request's log-likelihood and is-greedy flag and
every item's acc / acc_norm are written, with the aggregates and the package versions; the
WinoGrande items are also written in `eval --task`'s shape (stories_winogrande_task.jsonl).

Pinned: lm_eval 0.4.13 over the fixture environment (torch 2.15.0 CPU, transformers 5.23.0):

    python3 -m venv .venv-lmeval
    echo "$PWD/.venv-fixtures/lib/python3.11/site-packages" \
        > .venv-lmeval/lib/python3.11/site-packages/fixtures-env.pth
    .venv-lmeval/bin/pip install lm_eval==0.4.13
    .venv-lmeval/bin/python benches/lm_eval/choice_reference.py > benches/lm_eval/choice_reference.json
"""

import json
import sys
import tempfile
from pathlib import Path

import lm_eval
from lm_eval.tasks import TaskManager
import torch
import transformers

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MODEL = ROOT / "assets" / "stories260K"


def tasks_dir(work):
    (work / "stories_choice.yaml").write_text(f"""task: stories_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {HERE / 'stories_choice.jsonl'}
output_type: multiple_choice
test_split: test
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
""")
    (work / "stories_winogrande.yaml").write_text(f"""task: stories_winogrande
dataset_path: json
dataset_kwargs:
  data_files:
    test: {HERE / 'stories_winogrande.jsonl'}
output_type: multiple_choice
test_split: test
doc_to_text: !function winogrande_fns.doc_to_text
doc_to_target: !function winogrande_fns.doc_to_target
doc_to_choice: !function winogrande_fns.doc_to_choice
metric_list:
  - metric: acc
""")
    (work / "winogrande_fns.py").write_text(
        "from lm_eval.tasks.winogrande.preprocess_winogrande import "
        "doc_to_text, doc_to_target, doc_to_choice\n")


def winogrande_as_task():
    """stories_winogrande.jsonl in `eval --task`'s shape (what lm-eval's winogrande
    preprocessing makes of each item: a context per option, the text after the blank):
    stories_winogrande_task.jsonl."""
    with open(HERE / "stories_winogrande_task.jsonl", "w") as out:
        for line in (HERE / "stories_winogrande.jsonl").read_text().splitlines():
            doc = json.loads(line)
            blank = doc["sentence"].index("_")
            item = {"contexts": [doc["sentence"][:blank] + doc[o] for o in ("option1", "option2")],
                    "continuation": doc["sentence"][blank + 1:].strip(),
                    "label": int(doc["answer"]) - 1}
            out.write(json.dumps(item) + "\n")


def main():
    torch.manual_seed(0)
    winogrande_as_task()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        tasks_dir(work)
        manager = TaskManager(include_path=str(work))
        out = lm_eval.simple_evaluate(
            model="hf",
            model_args=f"pretrained={MODEL},dtype=float32,device=cpu",
            tasks=["stories_choice", "stories_winogrande"],
            task_manager=manager,
            batch_size=1,
            log_samples=True,
        )
    ref = {
        "made_by": "benches/lm_eval/choice_reference.py",
        "packages": {"python": sys.version.split()[0], "lm_eval": lm_eval.__version__,
                     "torch": torch.__version__, "transformers": transformers.__version__},
        "model": "assets/stories260K",
        "how": "lm_eval.simple_evaluate(model='hf', dtype=float32, device=cpu, batch_size=1)",
        "results": {t: {k: v for k, v in r.items() if isinstance(v, (int, float))}
                    for t, r in out["results"].items()},
        "samples": {},
    }
    for task, samples in out["samples"].items():
        rows = []
        for s in sorted(samples, key=lambda s: s["doc_id"]):
            rows.append({
                "doc_id": s["doc_id"],
                "target": s["target"],
                # Each request: (context, continuation) and its (log-likelihood, is greedy).
                "requests": [list(a) for a in s["arguments"]],
                "loglikelihoods": [[float(r[0][0]), bool(r[0][1])] for r in s["resps"]],
                "acc": s.get("acc"),
                "acc_norm": s.get("acc_norm"),
            })
        ref["samples"][task] = rows
    json.dump(ref, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
