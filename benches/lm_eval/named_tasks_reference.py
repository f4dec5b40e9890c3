"""lm-evaluation-harness's own scores of the bundled dense stories260K on small stand-ins for
the tasks `quantppl eval --task NAME` finds in the hub cache (issue 55): hellaswag, arc_easy,
arc_challenge, mmlu, winogrande. Each stand-in is a parquet file in the layout and schema of
the task's hub data set (Rowan/hellaswag `data/validation-*`, allenai/ai2_arc
`ARC-*/test-*`, cais/mmlu `all/test-*`, allenai/winogrande `winogrande_xl/validation-*`),
with a few items written here to exercise each task's preprocessing (HellaSwag's WikiHow
brackets and capitalisation, ARC's numeric answer keys and three-choice items, MMLU's
subjects, WinoGrande's blank). lm-eval runs its own task configs (each included unchanged,
only the data files pointed at the stand-ins) with its `hf` model in float32 on the CPU, batch
1; every item's requests, log-likelihoods, acc and acc_norm are written in the parquet files'
row order.

Pinned as choice_reference.py (lm_eval 0.4.13 in .venv-lmeval over the fixture environment):

    .venv-lmeval/bin/python benches/lm_eval/named_tasks_reference.py \
        > benches/lm_eval/named_tasks_reference.json
"""

import json
import sys
import tempfile
from pathlib import Path

import lm_eval
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import transformers
from lm_eval.tasks import TaskManager

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MODEL = ROOT / "assets" / "stories260K"
OUT = HERE / "named_tasks"
TASKS = Path(lm_eval.__file__).parent / "tasks"

HELLASWAG = [
    {"ind": 4, "activity_label": "Cooking", "ctx_a": "A man is in the kitchen.",
     "ctx_b": "he PUTS a pan on the stove", "ctx": "",
     "endings": ["and heats some oil in it.", "and [title] reads a book to the cat.",
                 "then the  dog barks at the door.", "and sings a song to his mom."],
     "source_id": "activitynet~x", "split": "val", "split_type": "indomain", "label": "0"},
    {"ind": 9, "activity_label": "Walking the dog", "ctx_a": "A girl walks with her dog in the park.",
     "ctx_b": "the dog", "ctx": "",
     "endings": ["eats a big red apple.", "flies up to the moon.", "runs after a ball.",
                 "reads a book."],
     "source_id": "activitynet~y", "split": "val", "split_type": "indomain", "label": "2"},
    {"ind": 12, "activity_label": "Home and Garden",
     "ctx_a": "[header] How to plant a tree [title] Dig a hole. [step] Make the hole wide.",
     "ctx_b": "", "ctx": "",
     "endings": ["[substeps] Put the tree in the hole.", "Eat the tree.",
                 "[title] Water the tree. [step] Give it a lot of water.", "Sleep in the hole."],
     "source_id": "wikihow~z", "split": "val", "split_type": "zeroshot", "label": "2"},
]

ARC_EASY = [
    {"id": "E1", "question": "What does a cat like to drink?",
     "choices": {"text": ["milk", "rocks", "sand", "fire"], "label": ["A", "B", "C", "D"]},
     "answerKey": "A"},
    {"id": "E2", "question": "Which animal can fly?",
     "choices": {"text": ["a dog", "a bird", "a fish", "a cow"], "label": ["1", "2", "3", "4"]},
     "answerKey": "2"},
    {"id": "E3", "question": "Where does the sun go at night?",
     "choices": {"text": ["down", "into a box", "to the park"], "label": ["A", "B", "C"]},
     "answerKey": "A"},
]

ARC_CHALLENGE = [
    {"id": "C1", "question": "Why did Lily take her umbrella to the park?",
     "choices": {"text": ["It was raining.", "She was hungry.", "The dog was big.",
                          "It was her birthday."], "label": ["A", "B", "C", "D"]},
     "answerKey": "A"},
    {"id": "C2", "question": "Tom was sad because he lost his toy. What did his mom do?",
     "choices": {"text": ["She helped him find it.", "She ate it.", "She flew away.",
                          "She sang to the tree."], "label": ["A", "B", "C", "D"]},
     "answerKey": "A"},
]

MMLU = [
    {"question": "What is 2 + 2?", "subject": "abstract_algebra",
     "choices": ["3", "4", "5", "6"], "answer": 1},
    {"question": "  Which set is a group under addition?  ", "subject": "abstract_algebra",
     "choices": ["the integers", "the odd numbers", "the empty set", "a cat"], "answer": 0},
    {"question": "What do plants need to grow?", "subject": "high_school_biology",
     "choices": ["sun and water", "toys", "shoes", "a car"], "answer": 0},
    {"question": "Which of these is a mammal?", "subject": "high_school_biology",
     "choices": ["a fish", "a frog", "a dog", "a bird"], "answer": 2},
]

WINOGRANDE = [
    {"sentence": "Tom could not lift the box because _ was too heavy.", "option1": "Tom",
     "option2": "the box", "answer": "2"},
    {"sentence": "Lily gave the ball to Ben because _ wanted to play with it.", "option1": "Lily",
     "option2": "Ben", "answer": "2"},
    {"sentence": "The cat ran from the dog, so _ was scared.", "option1": "the cat",
     "option2": "the dog", "answer": "1"},
]

# (name in quantppl, hub folder, file in the snapshot, rows, lm-eval yaml, split)
STAND_INS = [
    ("hellaswag", "Rowan--hellaswag", "data/validation-00000-of-00001.parquet", HELLASWAG,
     "hellaswag/hellaswag.yaml", "validation"),
    ("arc_easy", "allenai--ai2_arc", "ARC-Easy/test-00000-of-00001.parquet", ARC_EASY,
     "arc/arc_easy.yaml", "test"),
    ("arc_challenge", "allenai--ai2_arc", "ARC-Challenge/test-00000-of-00001.parquet",
     ARC_CHALLENGE, "arc/arc_challenge.yaml", "test"),
    ("mmlu", "cais--mmlu", "all/test-00000-of-00001.parquet", MMLU, None, "test"),
    ("winogrande", "allenai--winogrande", "winogrande_xl/validation-00000-of-00001.parquet",
     WINOGRANDE, "winogrande/default.yaml", "validation"),
]


def write_parquet(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def yaml(work, task, include, split, data):
    # The task's own config, unchanged but for where its split's rows come from (and no other
    # split: nothing else is read zero-shot).
    (work / f"{task}.yaml").write_text(
        f"task: {task}\ninclude: {include}\ndataset_path: parquet\ndataset_name: null\n"
        f"dataset_kwargs:\n  data_files:\n    {split}: {data}\n"
        "training_split: null\nvalidation_split: null\ntest_split: null\nfewshot_split: null\n"
        f"{split}_split: {split}\n")


def main():
    torch.manual_seed(0)
    order = {}  # lm-eval task -> (quantppl task, row indices in the stand-in's order)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, folder, rel, rows, config, split in STAND_INS:
            write_parquet(OUT / folder / rel, rows)
            if name != "mmlu":
                task = f"local_{name}"
                yaml(work, task, TASKS / config, split, OUT / folder / rel)
                order[task] = (name, list(range(len(rows))))
                continue
            for subject in sorted({r["subject"] for r in rows}):
                picked = [i for i, r in enumerate(rows) if r["subject"] == subject]
                data = work / f"mmlu_{subject}.parquet"
                write_parquet(data, [rows[i] for i in picked])
                task = f"local_mmlu_{subject}"
                yaml(work, task, TASKS / "mmlu" / "default" / f"mmlu_{subject}.yaml", split, data)
                order[task] = (name, picked)
        out = lm_eval.simple_evaluate(
            model="hf",
            model_args=f"pretrained={MODEL},dtype=float32,device=cpu",
            tasks=sorted(order),
            task_manager=TaskManager(include_path=str(work)),
            batch_size=1,
            log_samples=True,
        )
    ref = {
        "made_by": "benches/lm_eval/named_tasks_reference.py",
        "packages": {"python": sys.version.split()[0], "lm_eval": lm_eval.__version__,
                     "torch": torch.__version__, "transformers": transformers.__version__,
                     "pyarrow": pa.__version__},
        "model": "assets/stories260K",
        "how": "lm_eval.simple_evaluate(model='hf', dtype=float32, device=cpu, batch_size=1)",
        "hub_files": {name: f"{folder}/{rel}" for name, folder, rel, *_ in STAND_INS},
        "tasks": {},
    }
    for task, samples in out["samples"].items():
        name, rows = order[task]
        items = ref["tasks"].setdefault(name, [None] * len(
            next(s for s in STAND_INS if s[0] == name)[3]))
        for s in samples:
            items[rows[s["doc_id"]]] = {
                "target": s["target"],
                "requests": [list(a) for a in s["arguments"]],
                "loglikelihoods": [float(r[0][0]) for r in s["resps"]],
                "acc": s.get("acc"),
                "acc_norm": s.get("acc_norm"),
            }
    json.dump(ref, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
